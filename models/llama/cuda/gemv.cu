// Skinny matrix products for decode rows: y[rows, N] = x[rows, K] @ W[N, K]^T
// (transformers' Linear layout: W is [out_features, in_features], row-major, bf16).
//
// One block per 16 output columns (grid ceil_div(N, 16), block 256 = 8 warps). The block's
// 16 W rows are cut along K into units of 256 elements; warp w takes units w, w+8, ...
// Each lane issues all 16 of its 16-byte W loads of a unit (rows g and g+8, g = lane/4)
// before using any, then feeds them straight into tensor-core mma.m16n8k16 (bf16 in, fp32
// accumulate) with x as the 8-column operand: W is read from memory exactly once for up to
// 32 rows (rows in tiles of 8; rows > 32 go in passes of 32, re-reading W).
// The trick: a dot product may take its K elements in any order as long as W and x agree, so
// lane (g, t = lane%4) maps its own 8 consecutive elements k0..k0+7 (k0 = unit + 32u + 8t) onto
// the mma's k slots {2t, 2t+1, 2t+8, 2t+9} of two k16 steps: no shuffles, no shared memory
// for W, and every warp load covers whole 32-byte sectors (8 rows x 64 contiguous bytes).
// The 8 warps' partial sums are added in warp order through shared memory: fixed order, no
// atomics, bitwise deterministic for a given (rows, N, K).
// Variants (one template: how x is formed, how y is stored): gemv_bf16 / gemv_f32 store y;
// norm_gemv_* take x = rmsnorm(res) * nw on the fly (the norm fused in front); gemv_residual
// adds y into the residual stream; norm_gemv_swiglu multiplies gate and up rows side by side
// and stores silu(gate) * up (norm + gate/up projection + SwiGLU in one launch).
// K % 8 == 0, pointers 16-byte aligned. Grid (ceil_div(N, 16)) (the SwiGLU kernels:
// ceil_div(N, 8), N their output width), block 256.
#include "common.cuh"

#define GEMV_WARPS 8
#define GEMV_KU 8                    // 16-byte loads per W row per lane per unit
#define GEMV_UNIT (32 * GEMV_KU)     // K elements per warp unit
#define GEMV_MAX_NT 4                // row tiles of 8 per pass: 32 rows
// Experimental, off in the pinned build (and then compiled out entirely): with
// -DGEMV_STAGE_ELEMS=16000 a pass whose rows fit stages x once in shared memory (formed by all
// 256 threads, norm applied), and the mma loop reads it there instead of each lane loading and
// forming its x from L2. tests/cuda/bench_cuda_kernels.py times that build beside this one.
#ifndef GEMV_STAGE_ELEMS
#define GEMV_STAGE_ELEMS 0
#endif
#define GEMV_XPAD 32                 // staged row padding (elements): rows g, g+1 on other banks
// Experimental, off in the pinned build: with -DGEMV_TILE_STRIDE=1 a block walks its column
// tiles blockIdx.x, + gridDim.x, ... so a grid smaller than ceil_div(N, 16) takes the norm and
// the staged x once per block for several tiles.
#ifndef GEMV_TILE_STRIDE
#define GEMV_TILE_STRIDE 0
#endif

// Streaming weight load: read-only path, no L1 allocation, 256-byte L2 prefetch. Volatile keeps
// the first unit's loads before griddepcontrol.wait.
__device__ __forceinline__ uint4 ld_stream(const bf16 *p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
    return r;
}
// Activations (x, the residual) are written by the previous kernel, which under PDL may still
// be finishing when this kernel starts: read them at L2 (ld.global.cg). Neither the
// non-coherent path (__ldg) nor plain L1-cached loads are safe here: with plain loads, eager
// PDL launches on the H200 read stale lines (a decode row's logits came out as NaN), since the
// SM's L1 may hold lines from before the previous kernel's writes. The asm is not volatile, so
// the compiler may batch and hoist these loads (a volatile load is pinned between the mma
// statements: one round trip per mma); what keeps them after the wait is that their addresses
// come from after_wait(), a volatile statement placed after it.
__device__ __forceinline__ uint4 ld_act(const bf16 *p) {
    uint4 r;
    asm("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
    return r;
}
template <typename T>
__device__ __forceinline__ T *after_wait(T *p) {
    uint64_t a;
    asm volatile("mov.b64 %0, %1;" : "=l"(a) : "l"(reinterpret_cast<uint64_t>(p)) : "memory");
    return reinterpret_cast<T *>(a);
}

// c[16 x 8] += A[16 x 16] (row) * B[16 x 8] (col), bf16 operands, fp32 accumulate.
__device__ __forceinline__ void mma_bf16(float c[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// ---- the x operand: plain or RMS-normed -------------------------------------------------
// Each gives the 8 bf16 x values k..k+7 of a row, exactly as the standalone kernel would have
// stored them (norm.cu), so fusing changes no bits of x.
struct XPlain {
    const bf16 *x;
    __device__ XPlain after() const { return {after_wait(x)}; }
    template <int NT>
    __device__ void prologue(int, int, int, float *, float *) const {}
    __device__ uint4 load(int row, int k, int K, const float *) const {
        return ld_act(x + (size_t)row * K + k);
    }
};

// x = rmsnorm(res) * w: the block first takes 1/rms of each of its rows (all 256 threads over
// 16-byte chunks, every row's loads issued together; lanes by xor tree, then warps in order:
// fixed order), then scales x as it loads it.
struct XNorm {
    const bf16 *res, *w;
    float eps;
    __device__ XNorm after() const { return {after_wait(res), w, eps}; }
    template <int NT>
    __device__ void prologue(int r0, int R, int K, float *rs, float *red) const {
        const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
        float ss[8 * NT];
#pragma unroll
        for (int i = 0; i < 8 * NT; ++i) ss[i] = 0.f;
        for (int c = threadIdx.x * 8; c < K; c += 256 * 8) {
#pragma unroll
            for (int i = 0; i < 8 * NT; ++i) {
                if (i < R) {
                    float f[8];
                    unpack8(ld_act(res + (size_t)(r0 + i) * K + c), f);
#pragma unroll
                    for (int j = 0; j < 8; ++j) ss[i] += f[j] * f[j];
                }
            }
        }
#pragma unroll
        for (int i = 0; i < 8 * NT; ++i) {
            const float t = warp_sum(ss[i]);
            if (lane == 0) red[warp * 32 + i] = t;
        }
        __syncthreads();
        if (threadIdx.x < R) {
            float t = 0.f;
            for (int wi = 0; wi < GEMV_WARPS; ++wi) t += red[wi * 32 + threadIdx.x];
            rs[threadIdx.x] = 1.f / sqrtf(t / (float)K + eps);
        }
    }
    __device__ uint4 load(int row, int k, int K, const float *rs) const {
        float f[8], g[8];
        unpack8(ld_act(res + (size_t)row * K + k), f);
        unpack8(__ldg(reinterpret_cast<const uint4 *>(w + k)), g);
        const float r = rs[row];
#pragma unroll
        for (int j = 0; j < 8; ++j) f[j] = g[j] * rbf(f[j] * r);
        return pack8(f);
    }
};

// ---- the output: store bf16, store f32, or add into the residual ------------------------
// Which W rows a block multiplies and where its sums go. The plain outputs: a block takes 16
// consecutive rows of W (outputs n0 .. n0+15, n0 = 16 * blockIdx.x).
struct YBf16 {
    static constexpr bool SWIGLU = false;
    bf16 *y;
    __device__ void put(size_t i, float v) const { y[i] = to_bf(v); }
};
struct YF32 {
    static constexpr bool SWIGLU = false;
    float *y;
    __device__ void put(size_t i, float v) const { y[i] = v; }
};
// res = bf16(res + bf16(v)): the projection rounded to bf16, then the residual add, as the
// unfused add_rms_norm does it. Each element is read and written by one thread only.
struct YAddRes {
    static constexpr bool SWIGLU = false;
    bf16 *res;
    __device__ void put(size_t i, float v) const {
        res[i] = to_bf(to_f(__ldcg(res + i)) + rbf(v));
    }
};

// SwiGLU in the epilogue: W is gate_up [2N, K] (gate rows, then up rows); a block takes gate
// rows c0 .. c0+7 and the matching up rows N + c0 .. (c0 = 8 * blockIdx.x) and stores
// act = bf16(bf16(silu(bf16(gate))) * bf16(up)) [rows, N], as gemv + silu_mul would.
struct YSwiGLU {
    static constexpr bool SWIGLU = true;
    bf16 *act;
    __device__ void put(size_t i, float gate, float up) const {
        const float g = rbf(gate);
        act[i] = to_bf(rbf(g / (1.f + expf(-g))) * rbf(up));
    }
};

__device__ __forceinline__ void ld_unit(uint4 *a, uint4 *b, const bf16 *w0, const bf16 *w1,
                                        bool ok0, bool ok1, int kb, int t, int K) {
    const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < GEMV_KU; ++u) {
        const int k = kb + 32 * u + 8 * t;
        a[u] = (ok0 && k < K) ? ld_stream(w0 + k) : zero;
        b[u] = (ok1 && k < K) ? ld_stream(w1 + k) : zero;
    }
}

// x values k..k+7 of row `row` for the mma: from the staged copy, or formed from memory.
template <class X>
__device__ __forceinline__ uint4 x_operand(const X &xs, const bf16 *xsm, bool staged, int row, int r0,
                                           int k, int K, const float *rs) {
    if constexpr (GEMV_STAGE_ELEMS > 0) {
        if (staged) return *reinterpret_cast<const uint4 *>(xsm + (size_t)(row - r0) * (K + GEMV_XPAD) + k);
    }
    return xs.load(row, k, K, rs - r0);
}

// One pass over rows [r0, r0 + R), R <= 8 * NT. Each warp's first W unit is loaded before
// griddepcontrol.wait (W never depends on the previous kernel; x does), so under PDL the
// weight stream overlaps the previous kernel's tail.
template <int NT, class X, class Y>
__device__ __forceinline__ void gemv_pass(const X &xs0, const bf16 *__restrict__ W, const Y &ys,
                                          int r0, int R, int N, int K, float *red, float *rs,
                                          bf16 *xsm, bool first) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    // W rows of mma rows g and g + 8: outputs n0 + g and n0 + g + 8, or (SwiGLU) the gate and
    // up rows of output n0 + g.
    constexpr int COLS = Y::SWIGLU ? 8 : 16;
    int tile = blockIdx.x;
    int n0 = tile * COLS;
    int row0 = n0 + g, row1 = Y::SWIGLU ? N + n0 + g : n0 + g + 8;
    bool ok0 = row0 < N, ok1 = Y::SWIGLU ? row0 < N : row1 < N;
    const int last = Y::SWIGLU ? 2 * N - 1 : N - 1;
    const bf16 *w0 = W + (size_t)min(row0, last) * K;
    const bf16 *w1 = W + (size_t)min(row1, last) * K;
    int xrow[NT];
    bool okx[NT];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        const int row = nt * 8 + g;
        okx[nt] = row < R;
        xrow[nt] = r0 + (okx[nt] ? row : 0);
    }
    const uint4 zero = make_uint4(0, 0, 0, 0);
    uint4 a[GEMV_KU], b[GEMV_KU];
    int kb = warp * GEMV_UNIT;
    ld_unit(a, b, w0, w1, ok0, ok1, kb, t, K);
    if (first) {
        pdl_wait();
        pdl_launch_dependents();
    }
    const X xs = xs0.after();
    xs.template prologue<NT>(r0, R, K, rs, red);
    __syncthreads();
    bool staged = false;
    if constexpr (GEMV_STAGE_ELEMS > 0) {
        const int ld = K + GEMV_XPAD, n8 = K >> 3;
        staged = R * ld <= GEMV_STAGE_ELEMS;
        if (staged) {
            for (int i = threadIdx.x; i < R * n8; i += blockDim.x) {
                const int row = i / n8, c = (i - row * n8) * 8;
                *reinterpret_cast<uint4 *>(xsm + (size_t)row * ld + c) = xs.load(r0 + row, c, K, rs - r0);
            }
            __syncthreads();
        }
    }
    // rs holds 1/rms of this pass's rows: local row index i -> rs[i]
    for (;;) {  // column tiles (one, unless GEMV_TILE_STRIDE)
        float c[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) c[nt][0] = c[nt][1] = c[nt][2] = c[nt][3] = 0.f;
        while (kb < K) {
#pragma unroll
            for (int u = 0; u < GEMV_KU; ++u) {
                const int k = kb + 32 * u + 8 * t;
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    const uint4 xv = (okx[nt] && k < K) ? x_operand(xs, xsm, staged, xrow[nt], r0, k, K, rs) : zero;
                    mma_bf16(c[nt], a[u].x, b[u].x, a[u].y, b[u].y, xv.x, xv.y);
                    mma_bf16(c[nt], a[u].z, b[u].z, a[u].w, b[u].w, xv.z, xv.w);
                }
            }
            kb += GEMV_WARPS * GEMV_UNIT;
            if (kb < K) ld_unit(a, b, w0, w1, ok0, ok1, kb, t, K);
        }

        // c[nt][i]: i = 0, 1 -> (W row g, x rows 2t, 2t+1), i = 2, 3 -> (W row g + 8, same x rows).
        // red[warp][nt * 4 + i][lane]; then the 8 warps are added in order.
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) red[(warp * GEMV_MAX_NT * 4 + nt * 4 + i) * 32 + lane] = c[nt][i];
        __syncthreads();
        for (int j = threadIdx.x; j < NT * 4 * 32; j += blockDim.x) {
            const int q = j >> 5, l = j & 31;
            const int nt = q >> 2, i = q & 3;
            const int row = nt * 8 + 2 * (l & 3) + (i & 1);
            if constexpr (Y::SWIGLU) {  // i = 0, 1: gate sums; i + 2: the up sums of the same (row, output)
                const int col = n0 + (l >> 2);
                if (i < 2 && row < R && col < N) {
                    float gs = 0.f, us = 0.f;
#pragma unroll
                    for (int w = 0; w < GEMV_WARPS; ++w) {
                        gs += red[(w * GEMV_MAX_NT * 4 + q) * 32 + l];
                        us += red[(w * GEMV_MAX_NT * 4 + q + 2) * 32 + l];
                    }
                    ys.put((size_t)(r0 + row) * N + col, gs, us);
                }
            } else {
                const int col = n0 + (l >> 2) + (i >= 2 ? 8 : 0);
                if (row < R && col < N) {
                    float v = 0.f;
#pragma unroll
                    for (int w = 0; w < GEMV_WARPS; ++w) v += red[(w * GEMV_MAX_NT * 4 + q) * 32 + l];
                    ys.put((size_t)(r0 + row) * N + col, v);
                }
            }
        }
        __syncthreads();  // red (and rs) are reused by the next tile or pass
        if constexpr (GEMV_TILE_STRIDE == 0) {
            break;
        } else {
            tile += gridDim.x;
            if (tile * COLS >= N) break;
            n0 = tile * COLS;
            row0 = n0 + g;
            row1 = Y::SWIGLU ? N + n0 + g : n0 + g + 8;
            ok0 = row0 < N;
            ok1 = Y::SWIGLU ? row0 < N : row1 < N;
            w0 = W + (size_t)min(row0, last) * K;
            w1 = W + (size_t)min(row1, last) * K;
            kb = warp * GEMV_UNIT;
            ld_unit(a, b, w0, w1, ok0, ok1, kb, t, K);
        }
    }
}

template <class X, class Y>
__device__ __forceinline__ void gemv(const X &xs, const bf16 *__restrict__ W, const Y &ys,
                                     int rows, int N, int K) {
    __shared__ float red[GEMV_WARPS * GEMV_MAX_NT * 4 * 32];
    __shared__ float rs[8 * GEMV_MAX_NT];
#if GEMV_STAGE_ELEMS > 0
    __shared__ __align__(16) bf16 xsm[GEMV_STAGE_ELEMS];
#else
    bf16 *xsm = nullptr;
#endif
    for (int r0 = 0; r0 < rows; r0 += 8 * GEMV_MAX_NT) {
        const int R = min(8 * GEMV_MAX_NT, rows - r0);
        const bool first = r0 == 0;
        if (R <= 8) gemv_pass<1>(xs, W, ys, r0, R, N, K, red, rs, xsm, first);
        else if (R <= 16) gemv_pass<2>(xs, W, ys, r0, R, N, K, red, rs, xsm, first);
        else gemv_pass<4>(xs, W, ys, r0, R, N, K, red, rs, xsm, first);
    }
}

// y = x @ W^T
extern "C" __global__ void __launch_bounds__(256, 2)
gemv_bf16(const bf16 *__restrict__ x, const bf16 *__restrict__ W, bf16 *__restrict__ y,
                      int rows, int N, int K) {
    gemv(XPlain{x}, W, YBf16{y}, rows, N, K);
}
extern "C" __global__ void __launch_bounds__(256, 2)
gemv_f32(const bf16 *__restrict__ x, const bf16 *__restrict__ W, float *__restrict__ y,
                     int rows, int N, int K) {
    gemv(XPlain{x}, W, YF32{y}, rows, N, K);
}
// y = rmsnorm(res) * nw @ W^T: the RMSNorm fused into the projection that follows it.
extern "C" __global__ void __launch_bounds__(256, 2)
norm_gemv_bf16(const bf16 *__restrict__ res, const bf16 *__restrict__ nw,
                           const bf16 *__restrict__ W, bf16 *__restrict__ y, int rows, int N, int K,
                           float eps) {
    gemv(XNorm{res, nw, eps}, W, YBf16{y}, rows, N, K);
}
extern "C" __global__ void __launch_bounds__(256, 2)
norm_gemv_f32(const bf16 *__restrict__ res, const bf16 *__restrict__ nw,
                          const bf16 *__restrict__ W, float *__restrict__ y, int rows, int N, int K,
                          float eps) {
    gemv(XNorm{res, nw, eps}, W, YF32{y}, rows, N, K);
}
// res += x @ W^T: the projection fused with the residual add after it.
extern "C" __global__ void __launch_bounds__(256, 2)
gemv_residual(const bf16 *__restrict__ x, const bf16 *__restrict__ W, bf16 *res,
                          int rows, int N, int K) {
    gemv(XPlain{x}, W, YAddRes{res}, rows, N, K);
}
// act = silu(gate) * up, [gate | up] = x @ W^T, W = gate_up [2N, K]. Grid ceil_div(N, 8).
extern "C" __global__ void __launch_bounds__(256, 2)
gemv_swiglu(const bf16 *__restrict__ x, const bf16 *__restrict__ W, bf16 *__restrict__ act, int rows,
            int N, int K) {
    gemv(XPlain{x}, W, YSwiGLU{act}, rows, N, K);
}
// act = silu(gate) * up, [gate | up] = (rmsnorm(res) * nw) @ W^T, W = gate_up [2N, K]: the
// post-attention norm, the gate/up projection and SwiGLU in one launch. Grid ceil_div(N, 8).
extern "C" __global__ void __launch_bounds__(256, 2)
norm_gemv_swiglu(const bf16 *__restrict__ res, const bf16 *__restrict__ nw, const bf16 *__restrict__ W,
                 bf16 *__restrict__ act, int rows, int N, int K, float eps) {
    gemv(XNorm{res, nw, eps}, W, YSwiGLU{act}, rows, N, K);
}
