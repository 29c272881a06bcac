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
// x rows (grid (ceil_div(tiles, GEMM_TILES), ceil_div(M, 64))); 4 warps, 2 x 2, a warp 32 W
// rows x 32 x rows; W and x steps of 32 elements go to shared memory with cp.async, 3 deep. The
// normed variants sum each row's squares as the steps land (the lanes' sums of a unit kept in
// shared memory, added by warp_sum's tree when the unit is in), in the gemv's order.
#include "gemv.cuh"

#if !defined(GEMM_TILES)
#error "GEMM_TILES comes from the family's TILES (kern_models.common.cubins passes it as -D)"
#endif
static_assert(GEMM_TILES == 4, "the warps are laid out 2 x 2 over 64 W rows and 64 x rows");

#define GEMM_WM (GEMM_TILES / 2)       // gemv tiles (16-row mma tiles) a warp
#define GEMM_WN 4                      // 8-row mma tiles of x a warp
#define GEMM_BN (16 * GEMM_TILES)      // W rows a block
#define GEMM_BM (2 * 8 * GEMM_WN)      // x rows a block: 64
#define GEMM_KS 32                     // K elements a step (one gemv u: two k16 mmas)
#define GEMM_STAGES 3
#define GEMM_CHUNKS ((GEMM_BN + GEMM_BM) * GEMM_KS / 8 / 128)  // 16-byte copies a thread a step
#define GEMM_FRAG (GEMM_WM * GEMM_WN * 4)                      // accumulators a thread
// split variants: a block's partial in the scratch, per tile and partial: the accumulators in
// thread order, then the rows' sums of squares
#if !defined(GEMM_PART)
#error "GEMM_PART comes from the family's TILES (the manifest sizes the split variants' scratch with it)"
#endif
static_assert(GEMM_PART == GEMM_FRAG * 128 + GEMM_BM, "table.py's GEMM_PART");
static_assert(GEMM_TILES % 2 == 0 && GEMM_CHUNKS * 128 * 8 == (GEMM_BN + GEMM_BM) * GEMM_KS, "");

struct GemmSmem {
    alignas(16) bf16 w[GEMM_STAGES][GEMM_BN * GEMM_KS];  // rows of 64 bytes: conflict-free 16-byte reads
    alignas(16) bf16 x[GEMM_STAGES][GEMM_BM * GEMM_KS];
    float lane_ss[2][GEMM_BM][32];  // normed X: a unit's 32 lane sums of squares a row (this unit, the last)
    float scale[GEMM_BM];           // 1/rms of each x row
    int merge;
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
// warp_sum's xor tree over 32 lane values, as lane 0 ends with it (every lane ends with the same).
__device__ __forceinline__ float lane_tree(const float *v) {
    float a[16];  // each level's loop of constant length: unrolled into registers
#pragma unroll
    for (int i = 0; i < 16; ++i) a[i] = v[i] + v[i + 16];
#pragma unroll
    for (int i = 0; i < 8; ++i) a[i] = a[i] + a[i + 8];
#pragma unroll
    for (int i = 0; i < 4; ++i) a[i] = a[i] + a[i + 4];
#pragma unroll
    for (int i = 0; i < 2; ++i) a[i] = a[i] + a[i + 2];
    return a[0] + a[1];
}

template <class X> __device__ __forceinline__ const bf16 *x_rows(const X &xs) {
    if constexpr (X::NORM) return xs.res; else return xs.x;
}

// SPLIT: grid z = 8, block z computes partial z alone into `part` (GEMM_PART floats a tile and
// partial), and the last of a tile's blocks to finish (counter sem[tile], zero between launches,
// reset by that block) adds the partials in order and stores y: the same sums in the same order,
// eight times the blocks for the few-row steps of the wide decode program.
template <bool SPLIT, class X, class Y>
__device__ __forceinline__ void gemm(const X &xs, const bf16 *__restrict__ W, const Y &ys, int M, int N, int K,
                                     float *__restrict__ part = nullptr, int *__restrict__ sem = nullptr) {
    __shared__ GemmSmem sm;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3, wm = warp >> 1, wn = warp & 1;
    const int tile0 = blockIdx.x * GEMM_TILES, m0 = blockIdx.y * GEMM_BM;
    const int nu = (K + GEMV_UNIT - 1) / GEMV_UNIT;
    const int p0 = SPLIT ? blockIdx.z : 0, p1 = SPLIT ? p0 + 1 : 8;
    if (SPLIT && units_of(p0, nu) == 0) return;  // no units: the gemv adds this partial's 0
    int sb = 0, se = 0;  // this block's steps [sb, se) of the 8 nu
    for (int p = 0; p < p1; ++p) (p < p0 ? sb : se) += 8 * units_of(p, nu);
    se += sb;
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
        const int k = step_k(s, nu), st = (s - sb) % GEMM_STAGES;
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
        if (sb + s < se) load(sb + s);
        cp_async_commit();
    }

    float acc[GEMM_WM][GEMM_WN][4], tot[GEMM_WM][GEMM_WN][4];
#pragma unroll
    for (int mi = 0; mi < GEMM_WM; ++mi)
#pragma unroll
        for (int ni = 0; ni < GEMM_WN; ++ni)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mi][ni][e] = tot[mi][ni][e] = 0.f;
    // Normed X: the sum of squares of row tid (tid < BM), in the gemv's order: a unit's 32 lane
    // sums (XNorm::form of 8 elements) by warp_sum's tree, the units of a partial in order
    // (cur), the partials in order (ss).
    float cur = 0.f, ss = 0.f;
    auto unit_done = [&](int parity) {
        if (X::NORM && tid < GEMM_BM) cur += lane_tree(sm.lane_ss[parity][tid]);
    };

    int s = sb;
    for (int p = p0; p < p1; ++p) {
        const int steps = 8 * units_of(p, nu);
        if (steps == 0) continue;  // the gemv adds this partial's 0: the total does not change
        for (int e = 0; e < steps; ++e, ++s) {
            cp_async_wait<GEMM_STAGES - 2>();
            const int st = (s - sb) % GEMM_STAGES, parity = ((s - sb) >> 3) & 1;
            if constexpr (X::NORM) {  // x = bf16(nw * res), formed in place by the thread that copied it
                const int k = step_k(s, nu);
#pragma unroll
                for (int i = 0; i < GEMM_CHUNKS; ++i) {
                    const int c = tid + 128 * i, row = c >> 2;
                    if (row >= GEMM_BN) {
                        const int kc = k + 8 * (c & 3);
                        const bool okc = kc < K;
                        uint4 *q = reinterpret_cast<uint4 *>(sm.x[st] + (row - GEMM_BN) * GEMM_KS + 8 * (c & 3));
                        float l = 0.f;
                        *q = xs.form(*q, xs.weight(okc ? kc : 0), okc, l);
                        sm.lane_ss[parity][row - GEMM_BN][4 * (s & 7) + (c & 3)] = l;
                    }
                }
            }
            __syncthreads();
            if (X::NORM && (s & 7) == 0 && s > sb) {  // the previous unit's lane sums are all in
                unit_done(parity ^ 1);
                if (e == 0) ss += cur, cur = 0.f;  // and it closed a partial
            }
            if (s + GEMM_STAGES - 1 < se) load(s + GEMM_STAGES - 1);
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
    __syncthreads();  // the last unit's lane sums
    unit_done(((s - 1 - sb) >> 3) & 1);
    ss += cur;

    if constexpr (SPLIT) {
        const int tile = blockIdx.y * gridDim.x + blockIdx.x;
        float *mine = part + ((size_t)tile * 8 + p0) * GEMM_PART;
#pragma unroll
        for (int mi = 0; mi < GEMM_WM; ++mi)
#pragma unroll
            for (int ni = 0; ni < GEMM_WN; ++ni)
#pragma unroll
                for (int e = 0; e < 4; ++e) mine[((mi * GEMM_WN + ni) * 4 + e) * 128 + tid] = tot[mi][ni][e];
        if (X::NORM && tid < GEMM_BM) mine[GEMM_FRAG * 128 + tid] = ss;
        __threadfence();
        __syncthreads();
        if (tid == 0) {
            const int n_used = min(8, nu);
            const bool last = atomicAdd(sem + tile, 1) == n_used - 1;
            if (last) atomicExch(sem + tile, 0);
            sm.merge = last;
        }
        __syncthreads();
        if (!sm.merge) return;
        __threadfence();
        // the partials in order from 0, as the gemv adds its warps' (the empty ones add 0)
        ss = 0.f;
#pragma unroll
        for (int mi = 0; mi < GEMM_WM; ++mi)
#pragma unroll
            for (int ni = 0; ni < GEMM_WN; ++ni)
#pragma unroll
                for (int e = 0; e < 4; ++e) tot[mi][ni][e] = 0.f;
        for (int p = 0; p < min(8, nu); ++p) {
            const float *pp = part + ((size_t)tile * 8 + p) * GEMM_PART;
#pragma unroll
            for (int mi = 0; mi < GEMM_WM; ++mi)
#pragma unroll
                for (int ni = 0; ni < GEMM_WN; ++ni)
#pragma unroll
                    for (int e = 0; e < 4; ++e) tot[mi][ni][e] += __ldcg(pp + ((mi * GEMM_WN + ni) * 4 + e) * 128 + tid);
            if (X::NORM && tid < GEMM_BM) ss += __ldcg(pp + GEMM_FRAG * 128 + tid);
        }
    }
    if constexpr (X::NORM)
        if (tid < GEMM_BM) sm.scale[tid] = 1.f / sqrtf(ss / (float)K + xs.eps);
    __syncthreads();

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
    gemm<false>(XNorm{res, nw, eps}, W, YBf16{y}, rows, N, K);
}
extern "C" __global__ void __launch_bounds__(128, 4)
norm_gemm_f32(const bf16 *__restrict__ res, const bf16 *__restrict__ nw, const bf16 *__restrict__ W,
                         float *__restrict__ y, int rows, int N, int K, float eps) {
    gemm<false>(XNorm{res, nw, eps}, W, YF32{y}, rows, N, K);
}
extern "C" __global__ void __launch_bounds__(128, 4)
gemm_residual(const bf16 *__restrict__ x, const bf16 *__restrict__ W, bf16 *res, int rows, int N, int K) {
    gemm<false>(XPlain{x}, W, YAddRes{res}, rows, N, K);
}
extern "C" __global__ void __launch_bounds__(128, 4)
norm_gemm_swiglu(const bf16 *__restrict__ res, const bf16 *__restrict__ nw, const bf16 *__restrict__ W,
                            bf16 *__restrict__ act, int rows, int N, int K, float eps) {
    gemm<false>(XNorm{res, nw, eps}, W, YSwiGLU{act}, rows, N, K);
}
extern "C" __global__ void __launch_bounds__(128, 4)
norm_gemm_rope_append(const bf16 *__restrict__ res, const bf16 *__restrict__ nw,
                                 const bf16 *__restrict__ W, bf16 *__restrict__ y, char *__restrict__ kv_state,
                                 const int *__restrict__ page_table, const int *__restrict__ cu_seqlens,
                                 const int *__restrict__ pos, const float *__restrict__ table, int pages_per_seq,
                                 int rows, int n_seqs, int layer, int n_layers, int n_q_heads, int n_kv_heads,
                                 int head_dim, int page_tokens, int N, int K, float eps) {
    gemm<false>(XNorm{res, nw, eps}, W,
                rope_append_y(y, kv_state, page_table, cu_seqlens, pos, table, pages_per_seq, n_seqs, layer, n_layers, n_q_heads,
                             n_kv_heads, head_dim, page_tokens), rows, N, K);
}

// The wide decode program's (few rows, 8 blocks a tile, one a partial): part f32[tiles * 8 *
// GEMM_PART], sem i32[tiles] (zero before the first launch, zero again after each; tiles = the
// grid's x * y). Grid (ceil_div(tiles, GEMM_TILES), ceil_div(rows, 64), 8).
extern "C" __global__ void __launch_bounds__(128, 4)
norm_gemm_bf16_split(const bf16 *__restrict__ res, const bf16 *__restrict__ nw, const bf16 *__restrict__ W,
                     bf16 *__restrict__ y, float *__restrict__ part, int *__restrict__ sem, int rows, int N, int K,
                     float eps) {
    gemm<true>(XNorm{res, nw, eps}, W, YBf16{y}, rows, N, K, part, sem);
}
extern "C" __global__ void __launch_bounds__(128, 4)
gemm_residual_split(const bf16 *__restrict__ x, const bf16 *__restrict__ W, bf16 *res, float *__restrict__ part,
                    int *__restrict__ sem, int rows, int N, int K) {
    gemm<true>(XPlain{x}, W, YAddRes{res}, rows, N, K, part, sem);
}
extern "C" __global__ void __launch_bounds__(128, 4)
norm_gemm_swiglu_split(const bf16 *__restrict__ res, const bf16 *__restrict__ nw, const bf16 *__restrict__ W,
                       bf16 *__restrict__ act, float *__restrict__ part, int *__restrict__ sem, int rows, int N, int K,
                       float eps) {
    gemm<true>(XNorm{res, nw, eps}, W, YSwiGLU{act}, rows, N, K, part, sem);
}
extern "C" __global__ void __launch_bounds__(128, 4)
norm_gemm_rope_append_split(const bf16 *__restrict__ res, const bf16 *__restrict__ nw,
                            const bf16 *__restrict__ W, bf16 *__restrict__ y, char *__restrict__ kv_state,
                            const int *__restrict__ page_table, const int *__restrict__ cu_seqlens,
                            const int *__restrict__ pos, const float *__restrict__ table, float *__restrict__ part,
                            int *__restrict__ sem, int pages_per_seq, int rows, int n_seqs, int layer, int n_layers,
                            int n_q_heads, int n_kv_heads, int head_dim, int page_tokens, int N, int K, float eps) {
    gemm<true>(XNorm{res, nw, eps}, W,
               rope_append_y(y, kv_state, page_table, cu_seqlens, pos, table, pages_per_seq, n_seqs, layer, n_layers, n_q_heads,
                             n_kv_heads, head_dim, page_tokens), rows, N, K, part, sem);
}
