// Row-invariant projections for many rows: y[M, N] = x[M, K] @ W[N, K]^T with each output
// reduced in exactly the order of the gemv kernels (gemv.cuh), so a row gets the same bits from
// these (prefill's rows, the wide decode program's) as from the gemv decode program, whatever
// M is and wherever the row sits. That order, fixed by K alone: K is cut in units of 256;
// partial p (the gemv's warp p) takes units p, p + 8, p + 16, ... in turn, each as 8 steps of
// 32 elements, each step two tensor-core mma.m16n8k16 (bf16 in, fp32 accumulate) whose k slots
// hold the elements as the gemv's lanes feed them (lane (g, t): elements 8t .. 8t + 7 of the
// step, W as the 16-row operand, x rows as the 8 columns); the 8 partials are then added in
// order p = 0 .. 7 from 0. Here a block does what the gemv's 8 warps do side by side one after
// the other: it walks the partials in turn with one accumulator, adding it to the running total
// at each partial's end, so its tile shape (BN W rows x BM x rows) is free: no row's arithmetic
// depends on the others or on M.
// The variants are the gemv's (its X and Y: how x is formed, how y is stored), so the fused
// norm (1/rms from the gemv's sum of squares order, applied to the sums), SwiGLU, rope + KV
// append and the residual add give the gemv's bits too.
// Tiles: a block takes GEMM_TILES consecutive gemv tiles (16 W rows, or 8 pairs, each) and 64
// x rows (grid (ceil_div(tiles, GEMM_TILES), ceil_div(M, 64))); 4 warps, 2 x 2, a warp 16 W
// rows x 32 x rows; W and x steps of 32 elements go to shared memory with cp.async, 4 deep.
#include "gemv.cuh"

#if !defined(GEMM_TILES)
#error "GEMM_TILES comes from the family's TILES (kern_models.common.cubins passes it as -D)"
#endif

#define GEMM_WM (GEMM_TILES / 2)       // gemv tiles (16-row mma tiles) a warp
#define GEMM_WN 4                      // 8-row mma tiles of x a warp
#define GEMM_BN (16 * GEMM_TILES)      // W rows a block
#define GEMM_BM (2 * 8 * GEMM_WN)      // x rows a block: 64
#define GEMM_KS 32                     // K elements a step (one gemv u: two k16 mmas)
#define GEMM_STAGES 4
#define GEMM_CHUNKS ((GEMM_BN + GEMM_BM) * GEMM_KS / 8 / 128)  // 16-byte copies a thread a step
static_assert(GEMM_TILES % 2 == 0 && GEMM_CHUNKS * 128 * 8 == (GEMM_BN + GEMM_BM) * GEMM_KS, "");

struct GemmSmem {
    alignas(16) bf16 w[GEMM_STAGES][GEMM_BN * GEMM_KS];  // rows of 64 bytes: conflict-free 16-byte reads
    alignas(16) bf16 x[GEMM_STAGES][GEMM_BM * GEMM_KS];
    float scale[GEMM_BM];                                // 1/rms of each x row (normed X)
};
static_assert(sizeof(GemmSmem) <= 48 * 1024, "static shared memory");

// Units with index = p (mod 8): partial p's share of the nu units.
__device__ __forceinline__ int units_of(int p, int nu) { return p < nu ? (nu - p + 7) / 8 : 0; }
// The K offset of step s (8 a unit, units in partial order).
__device__ __forceinline__ int step_k(int s, int nu) {
    int ui = s >> 3, p = 0;
    while (ui >= units_of(p, nu)) ui -= units_of(p++, nu);
    return GEMV_UNIT * (p + 8 * ui) + GEMM_KS * (s & 7);
}

template <class X> __device__ __forceinline__ const bf16 *x_rows(const X &xs) {
    if constexpr (X::NORM) return xs.res; else return xs.x;
}

template <class X, class Y>
__device__ __forceinline__ void gemm(const X &xs, const bf16 *__restrict__ W, const Y &ys, int M, int N, int K) {
    __shared__ GemmSmem sm;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3, wm = warp >> 1, wn = warp & 1;
    const int tile0 = blockIdx.x * GEMM_TILES, m0 = blockIdx.y * GEMM_BM;
    const int nu = (K + GEMV_UNIT - 1) / GEMV_UNIT, S = 8 * nu;
    const bf16 *xg = x_rows(xs);

    // This thread's copies a step: chunk c = tid + 128 i; rows of W first (BN of them), then x.
    const bf16 *src[GEMM_CHUNKS];
    bool ok[GEMM_CHUNKS];
#pragma unroll
    for (int i = 0; i < GEMM_CHUNKS; ++i) {
        const int c = tid + 128 * i, row = c >> 2;
        if (row < GEMM_BN) {
            const int tile = tile0 + row / 16, ri = row % 16;
            int wr;
            if constexpr (Y::PAIRED) {
                int w0, w1;
                ok[i] = ys.wrows(tile, ri % 8, N, w0, w1);
                wr = ri < 8 ? w0 : w1;
            } else {
                wr = GEMV_COLS * tile + ri;
                ok[i] = wr < N;
            }
            src[i] = W + (size_t)(ok[i] ? wr : 0) * K + 8 * (c & 3);
        } else {
            const int xr = m0 + row - GEMM_BN;
            ok[i] = xr < M;
            src[i] = xg + (size_t)(ok[i] ? xr : 0) * K + 8 * (c & 3);
        }
    }
    auto load = [&](int s) {
        const int k = step_k(s, nu), st = s % GEMM_STAGES;
#pragma unroll
        for (int i = 0; i < GEMM_CHUNKS; ++i) {
            const int c = tid + 128 * i, row = c >> 2;
            bf16 *dst = row < GEMM_BN ? sm.w[st] + row * GEMM_KS + 8 * (c & 3)
                                      : sm.x[st] + (row - GEMM_BN) * GEMM_KS + 8 * (c & 3);
            const bool in = ok[i] && k + 8 * (c & 3) < K;  // past K: zeros, as the gemv's loads
            cp_async16_zfill(dst, in ? src[i] + k : src[i], in ? 16 : 0);
        }
    };
#pragma unroll
    for (int s = 0; s < GEMM_STAGES - 1; ++s) {
        if (s < S) load(s);
        cp_async_commit();
    }

    // 1/rms of the block's x rows, summed as the gemv sums it: a unit's 256 elements as 32
    // lanes of 8 (XNorm::form), the lanes by warp_sum, the units of a partial in order, the 8
    // partials in order.
    if constexpr (X::NORM) {
        for (int i = warp; i < GEMM_BM; i += 4) {
            const int row = min(m0 + i, M - 1);
            float part[8];
#pragma unroll
            for (int p = 0; p < 8; ++p) {
                part[p] = 0.f;
                for (int kb = p * GEMV_UNIT; kb < K; kb += 8 * GEMV_UNIT) {
                    const int kc = kb + 8 * lane;
                    const bool okc = kc < K;
                    float ss = 0.f;
                    xs.form(xs.fetch(row, okc ? kc : 0, K), xs.weight(okc ? kc : 0), okc, ss);
                    part[p] += warp_sum(ss);
                }
            }
            float s = 0.f;
#pragma unroll
            for (int p = 0; p < 8; ++p) s += part[p];
            if (lane == 0) sm.scale[i] = 1.f / sqrtf(s / (float)K + xs.eps);
        }
    }

    float acc[GEMM_WM][GEMM_WN][4], tot[GEMM_WM][GEMM_WN][4];
#pragma unroll
    for (int mi = 0; mi < GEMM_WM; ++mi)
#pragma unroll
        for (int ni = 0; ni < GEMM_WN; ++ni)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mi][ni][e] = tot[mi][ni][e] = 0.f;

    int s = 0;
    for (int p = 0; p < 8; ++p) {
        const int steps = 8 * units_of(p, nu);
        if (steps == 0) continue;  // the gemv adds this partial's 0: the total does not change
        for (int e = 0; e < steps; ++e, ++s) {
            cp_async_wait<GEMM_STAGES - 2>();
            const int st = s % GEMM_STAGES;
            if constexpr (X::NORM) {  // x = bf16(nw * res), formed in place by the thread that copied it
                const int k = step_k(s, nu);
#pragma unroll
                for (int i = 0; i < GEMM_CHUNKS; ++i) {
                    const int c = tid + 128 * i, row = c >> 2;
                    if (row >= GEMM_BN) {
                        const int kc = k + 8 * (c & 3);
                        const bool okc = kc < K;
                        uint4 *q = reinterpret_cast<uint4 *>(sm.x[st] + (row - GEMM_BN) * GEMM_KS + 8 * (c & 3));
                        float ss = 0.f;
                        *q = xs.form(*q, xs.weight(okc ? kc : 0), okc, ss);
                    }
                }
            }
            __syncthreads();
            if (s + GEMM_STAGES - 1 < S) load(s + GEMM_STAGES - 1);
            cp_async_commit();
            uint4 xv[GEMM_WN];
#pragma unroll
            for (int ni = 0; ni < GEMM_WN; ++ni)
                xv[ni] = *reinterpret_cast<const uint4 *>(sm.x[st] + ((wn * GEMM_WN + ni) * 8 + g) * GEMM_KS + 8 * t);
#pragma unroll
            for (int mi = 0; mi < GEMM_WM; ++mi) {
                const bf16 *wr = sm.w[st] + ((wm * GEMM_WM + mi) * 16 + g) * GEMM_KS + 8 * t;
                const uint4 a = *reinterpret_cast<const uint4 *>(wr);
                const uint4 b = *reinterpret_cast<const uint4 *>(wr + 8 * GEMM_KS);
#pragma unroll
                for (int ni = 0; ni < GEMM_WN; ++ni) {
                    mma_bf16(acc[mi][ni], a.x, b.x, a.y, b.y, xv[ni].x, xv[ni].y);
                    mma_bf16(acc[mi][ni], a.z, b.z, a.w, b.w, xv[ni].z, xv[ni].w);
                }
            }
        }
#pragma unroll
        for (int mi = 0; mi < GEMM_WM; ++mi)
#pragma unroll
            for (int ni = 0; ni < GEMM_WN; ++ni)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    tot[mi][ni][e] += acc[mi][ni][e];
                    acc[mi][ni][e] = 0.f;
                }
    }
    cp_async_wait<0>();
    __syncthreads();  // sm.scale

    // tot[mi][ni][e]: e = 0, 1 -> (mma row g, x rows 2t, 2t + 1), e = 2, 3 -> (mma row g + 8, same).
#pragma unroll
    for (int mi = 0; mi < GEMM_WM; ++mi) {
        const int tile = tile0 + wm * GEMM_WM + mi;
#pragma unroll
        for (int ni = 0; ni < GEMM_WN; ++ni) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int i = (wn * GEMM_WN + ni) * 8 + 2 * t + e, r = m0 + i;
                if (r >= M) continue;
                const float scale = X::NORM ? sm.scale[i] : 1.f;
                if constexpr (Y::PAIRED) {
                    int w0, w1;
                    if (ys.wrows(tile, g, N, w0, w1)) ys.put(r, tile, g, N, tot[mi][ni][e] * scale, tot[mi][ni][e + 2] * scale);
                } else {
                    const int col = GEMV_COLS * tile + g;
                    if (col < N) ys.put((size_t)r * N + col, tot[mi][ni][e] * scale);
                    if (col + 8 < N) ys.put((size_t)r * N + col + 8, tot[mi][ni][e + 2] * scale);
                }
            }
        }
    }
}

// The gemv.cu entries' twins: the same parameters, the same bits for every row.
extern "C" __global__ void __launch_bounds__(128, 4)
norm_gemm_bf16(const bf16 *__restrict__ res, const bf16 *__restrict__ nw, const bf16 *__restrict__ W,
                          bf16 *__restrict__ y, int rows, int N, int K, float eps) {
    gemm(XNorm{res, nw, eps}, W, YBf16{y}, rows, N, K);
}
extern "C" __global__ void __launch_bounds__(128, 4)
norm_gemm_f32(const bf16 *__restrict__ res, const bf16 *__restrict__ nw, const bf16 *__restrict__ W,
                         float *__restrict__ y, int rows, int N, int K, float eps) {
    gemm(XNorm{res, nw, eps}, W, YF32{y}, rows, N, K);
}
extern "C" __global__ void __launch_bounds__(128, 4)
gemm_residual(const bf16 *__restrict__ x, const bf16 *__restrict__ W, bf16 *res, int rows, int N, int K) {
    gemm(XPlain{x}, W, YAddRes{res}, rows, N, K);
}
extern "C" __global__ void __launch_bounds__(128, 4)
norm_gemm_swiglu(const bf16 *__restrict__ res, const bf16 *__restrict__ nw, const bf16 *__restrict__ W,
                            bf16 *__restrict__ act, int rows, int N, int K, float eps) {
    gemm(XNorm{res, nw, eps}, W, YSwiGLU{act}, rows, N, K);
}
extern "C" __global__ void __launch_bounds__(128, 4)
norm_gemm_rope_append(const bf16 *__restrict__ res, const bf16 *__restrict__ nw,
                                 const bf16 *__restrict__ W, bf16 *__restrict__ y, char *__restrict__ kv_state,
                                 const int *__restrict__ page_table, const int *__restrict__ cu_seqlens,
                                 const int *__restrict__ pos, const float *__restrict__ table, int pages_per_seq,
                                 int rows, int n_seqs, int layer, int n_layers, int n_q_heads, int n_kv_heads,
                                 int head_dim, int page_tokens, int N, int K, float eps) {
    const KvAppend app{nullptr, kv_state, page_table, cu_seqlens, pages_per_seq, n_seqs, layer, n_layers,
                       page_tokens};
    gemm(XNorm{res, nw, eps}, W, YRopeAppend{y, pos, table, app, n_q_heads, n_kv_heads, head_dim}, rows, N, K);
}
