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
// gemv_bf16 writes bf16 y, gemv_f32 writes fp32 y (LM-head logits).
// K % 8 == 0, pointers 16-byte aligned. Grid (ceil_div(N, 16)), block 256.
#include "common.cuh"

#define GEMV_WARPS 8
#define GEMV_KU 8                    // 16-byte loads per W row per lane per unit
#define GEMV_UNIT (32 * GEMV_KU)     // K elements per warp unit
#define GEMV_MAX_NT 4                // row tiles of 8 per pass: 32 rows

template <typename OutT>
__device__ __forceinline__ void store(OutT *y, float v);
template <> __device__ __forceinline__ void store<float>(float *y, float v) { *y = v; }
template <> __device__ __forceinline__ void store<bf16>(bf16 *y, float v) { *y = to_bf(v); }

// Streaming weight load: read-only path, no L1 allocation, 256-byte L2 prefetch. Volatile
// (ORDERED) keeps the loads before a later griddepcontrol.wait; the plain form lets the
// compiler schedule them (used by the 32-row pass, which waits first: fewer registers).
template <bool ORDERED>
__device__ __forceinline__ uint4 ld_stream(const bf16 *p) {
    uint4 r;
    if (ORDERED)
        asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
    else
        asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
            : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
    return r;
}
__device__ __forceinline__ uint4 ld_ro(const bf16 *p) {
    return __ldg(reinterpret_cast<const uint4 *>(p));
}

// c[16 x 8] += A[16 x 16] (row) * B[16 x 8] (col), bf16 operands, fp32 accumulate.
__device__ __forceinline__ void mma_bf16(float c[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// One pass over rows [r0, r0 + R), R <= 8 * NT.
template <typename OutT, int NT>
__device__ __forceinline__ void gemv_pass(const bf16 *__restrict__ x, const bf16 *__restrict__ W,
                                          OutT *__restrict__ y, int r0, int R, int N, int K,
                                          float *red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int n0 = blockIdx.x * 16;
    const bool ok0 = n0 + g < N, ok1 = n0 + g + 8 < N;
    const bf16 *w0 = W + (size_t)min(n0 + g, N - 1) * K;
    const bf16 *w1 = W + (size_t)min(n0 + g + 8, N - 1) * K;
    const bf16 *xr[NT];
    bool okx[NT];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        const int row = nt * 8 + g;
        okx[nt] = row < R;
        xr[nt] = x + (size_t)(r0 + (okx[nt] ? row : 0)) * K;
    }
    float c[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) c[nt][0] = c[nt][1] = c[nt][2] = c[nt][3] = 0.f;

    const uint4 zero = make_uint4(0, 0, 0, 0);
    // Rows <= 16: each warp's first W loads are issued before griddepcontrol.wait (they
    // overlap the previous kernel under PDL). 32-row passes wait first.
    constexpr bool EARLY = NT <= 2;
    if (!EARLY) pdl_wait();
    for (int kb = warp * GEMV_UNIT; kb < K; kb += GEMV_WARPS * GEMV_UNIT) {
        uint4 a[GEMV_KU], b[GEMV_KU];
#pragma unroll
        for (int u = 0; u < GEMV_KU; ++u) {
            const int k = kb + 32 * u + 8 * t;
            a[u] = (ok0 && k < K) ? ld_stream<EARLY>(w0 + k) : zero;
            b[u] = (ok1 && k < K) ? ld_stream<EARLY>(w1 + k) : zero;
        }
        if (EARLY && kb == warp * GEMV_UNIT) pdl_wait();  // W never depends on the previous kernel; x does
#pragma unroll
        for (int u = 0; u < GEMV_KU; ++u) {
            const int k = kb + 32 * u + 8 * t;
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                const uint4 xv = (okx[nt] && k < K) ? ld_ro(xr[nt] + k) : zero;
                mma_bf16(c[nt], a[u].x, b[u].x, a[u].y, b[u].y, xv.x, xv.y);
                mma_bf16(c[nt], a[u].z, b[u].z, a[u].w, b[u].w, xv.z, xv.w);
            }
        }
    }

    if (EARLY && warp * GEMV_UNIT >= K) pdl_wait();  // a warp without units: wait before any write
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
        const int col = n0 + (l >> 2) + (i >= 2 ? 8 : 0);
        if (row < R && col < N) {
            float v = 0.f;
#pragma unroll
            for (int w = 0; w < GEMV_WARPS; ++w) v += red[(w * GEMV_MAX_NT * 4 + q) * 32 + l];
            store<OutT>(y + (size_t)(r0 + row) * N + col, v);
        }
    }
    __syncthreads();  // red is reused by the next pass
}

template <typename OutT>
__device__ __forceinline__ void gemv(const bf16 *__restrict__ x, const bf16 *__restrict__ W,
                                     OutT *__restrict__ y, int rows, int N, int K) {
    __shared__ float red[GEMV_WARPS * GEMV_MAX_NT * 4 * 32];
    pdl_launch_dependents();
    for (int r0 = 0; r0 < rows; r0 += 8 * GEMV_MAX_NT) {
        const int R = min(8 * GEMV_MAX_NT, rows - r0);
        if (R <= 8) gemv_pass<OutT, 1>(x, W, y, r0, R, N, K, red);
        else if (R <= 16) gemv_pass<OutT, 2>(x, W, y, r0, R, N, K, red);
        else gemv_pass<OutT, 4>(x, W, y, r0, R, N, K, red);
    }
}

extern "C" __global__ void __launch_bounds__(256, 2)
gemv_bf16(const bf16 *__restrict__ x, const bf16 *__restrict__ W, bf16 *__restrict__ y, int rows,
          int N, int K) {
    gemv<bf16>(x, W, y, rows, N, K);
}

extern "C" __global__ void __launch_bounds__(256, 2)
gemv_f32(const bf16 *__restrict__ x, const bf16 *__restrict__ W, float *__restrict__ y, int rows,
         int N, int K) {
    gemv<float>(x, W, y, rows, N, K);
}
