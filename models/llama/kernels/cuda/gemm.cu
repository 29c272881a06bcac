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
// Tiles (GemmCfg below): prefill's entries take 8 consecutive gemv tiles (16 W rows, or 8
// pairs, each) beside 128 x rows a block (grid (ceil_div(tiles, 8), ceil_div(M, 128))), 8
// warps, 2 x 4, a warp 64 W rows x 32 x rows; the split variants 4 tiles beside 64 x rows, 4
// warps, 2 x 2. W and x go to shared memory with cp.async in stages of two 32-element steps, 4
// deep (the split variants: one step, 3 deep). The
// normed variants sum each row's squares as the steps land (the lanes' sums of a unit kept in
// shared memory, added by warp_sum's tree when the unit is in), in the gemv's order.
#include "gemv.cuh"

#if !defined(GEMM_TILES) || !defined(GEMM_PART) || !defined(GEMM_BIG_TILES) || !defined(GEMM_BIG_ROWS) || \
    !defined(GEMM_BIG_SMEM) || !defined(GEMM_SMEM)
#error "the GEMM_* constants come from the family's TILES (kern_models.common.cubins passes them as -D)"
#endif

// A block's shape: WW x WX warps, a warp WM gemv tiles (16 W rows each) beside WN 8-row tiles of
// x. A stage holds SPS steps of 32 K elements of the block's W and x rows (each step its own
// rows of 64 bytes: conflict-free 16-byte fragment reads); cp.async fills STAGES of them ahead,
// one barrier a stage. Shared memory is dynamic.
template <int WW_, int WX_, int WM_, int WN_, int SPS_, int STAGES_>
struct GemmCfg {
    static constexpr int WW = WW_, WX = WX_, WM = WM_, WN = WN_, SPS = SPS_, STAGES = STAGES_;
    static constexpr int THREADS = 32 * WW * WX;
    static constexpr int TILES = WW * WM;             // gemv tiles a block
    static constexpr int BN = 16 * TILES;             // W rows a block
    static constexpr int BM = 8 * WN * WX;            // x rows a block
    static constexpr int KS = 32;                     // K elements a step (one gemv u: two k16 mmas)
    static constexpr int CPR = 4 * SPS;               // 16-byte chunks a row a stage
    static constexpr int CHUNKS = (BN + BM) * CPR / THREADS;  // 16-byte copies a thread a stage
    static constexpr int FRAG = WM * WN * 4;          // accumulators a thread
    static constexpr int PART = FRAG * THREADS + BM;  // split: a (tile, partial)'s floats in the scratch
    // shared memory: W stages, x stages, two units' lane sums of squares a row, 1/rms a row, a flag
    static constexpr int W_STAGE = SPS * BN * KS, X_STAGE = SPS * BM * KS;  // elements
    static constexpr int W_BYTES = STAGES * W_STAGE * 2, X_BYTES = STAGES * X_STAGE * 2;
    static constexpr int SS_LD = 33;  // floats a row's lane sums: the rows' sums of one lane on other banks
    static constexpr int SS_BYTES = 2 * BM * SS_LD * 4;
    static constexpr int SMEM = W_BYTES + X_BYTES + SS_BYTES + BM * 4 + 16;
    static_assert(CHUNKS * THREADS == (BN + BM) * CPR && THREADS % CPR == 0 && 8 % SPS == 0,
                  "every thread copies the same chunk column of whole rows; a unit is whole stages");
};
// The wide decode program's split variants (few rows: many small blocks) and prefill's (many
// rows: 128 x 128 a block, 8 warps of 64 W rows x 32 x rows, stages of 64 K elements).
using GemmSmall = GemmCfg<2, 2, 2, 4, 1, 3>;
using GemmBig = GemmCfg<2, 4, 4, 4, 2, 4>;
static_assert(GemmSmall::TILES == GEMM_TILES && GemmSmall::BM == 64 && GemmSmall::PART == GEMM_PART &&
              GemmSmall::SMEM == GEMM_SMEM, "table.py's GEMM_TILES, GEMM_PART, GEMM_SMEM");
static_assert(GemmBig::TILES == GEMM_BIG_TILES && GemmBig::BM == GEMM_BIG_ROWS && GemmBig::SMEM == GEMM_BIG_SMEM,
              "table.py's GEMM_BIG_*");

extern __shared__ __align__(16) char gemm_smem[];
template <class C>
struct GemmMem {
    __device__ bf16 *w(int st) const { return reinterpret_cast<bf16 *>(gemm_smem) + st * C::W_STAGE; }
    __device__ bf16 *x(int st) const { return reinterpret_cast<bf16 *>(gemm_smem + C::W_BYTES) + st * C::X_STAGE; }
    __device__ float *lane_ss(int parity, int row) const {
        return reinterpret_cast<float *>(gemm_smem + C::W_BYTES + C::X_BYTES) + (parity * C::BM + row) * C::SS_LD;
    }
    __device__ float *scale() const {
        return reinterpret_cast<float *>(gemm_smem + C::W_BYTES + C::X_BYTES + C::SS_BYTES);
    }
    __device__ int *merge() const { return reinterpret_cast<int *>(scale() + C::BM); }
};

// Units with index = p (mod 8): partial p's share of the nu units.
__device__ __forceinline__ int units_of(int p, int nu) { return p < nu ? (nu - p + 7) / 8 : 0; }
// Where the steps go, in partial order: partial p takes units p, p + 8, ... (8 steps each). The
// cursor walks them a stage (SPS steps) at a time; k is the K offset of its stage's first step.
struct KCursor {
    int p, u, e, nu;  // partial, unit, step in the unit
    __device__ int k() const { return GEMV_UNIT * u + 32 * e; }
    __device__ void next(int sps) {
        e += sps;
        if (e == 8) {
            e = 0;
            u += 8;
            if (u >= nu) u = ++p;
        }
    }
};
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

// Row (W rows first, then x rows) of a thread's copy i a stage (its chunk column is tid % CPR).
// A thread's W copies come in pairs, rows R and R + 8 of one gemv tile: once they land it
// interleaves the pair's 4-byte words (pair_words), so one 16-byte read is an mma's whole
// 16-row operand (rows g and g + 8, in the gemv's k slots): no register moves to assemble it.
template <class C>
__device__ __forceinline__ int copy_row(int tid, int i) {
    constexpr int RSTEP = C::THREADS / C::CPR, WCH = C::BN / RSTEP;
    static_assert(C::BN % RSTEP == 0 && WCH % 2 == 0 && RSTEP % 8 == 0, "W copies in pairs of rows");
    const int q = tid / C::CPR;
    if (i < WCH) return 16 * (q / 8 + (RSTEP / 8) * (i / 2)) + q % 8 + 8 * (i % 2);
    return q + RSTEP * i;
}
// a = row R's 8 elements, b = row R + 8's: a becomes the first k16's operand words (R: 0-1,
// R+8: 0-1, R: 2-3, R+8: 2-3 of the 8 elements), b the second's (4-5, 6-7).
__device__ __forceinline__ void pair_words(uint4 *pa, uint4 *pb) {
    const uint4 a = *pa, b = *pb;
    *pa = make_uint4(a.x, b.x, a.y, b.y);
    *pb = make_uint4(a.z, b.z, a.w, b.w);
}

template <class X> __device__ __forceinline__ const bf16 *x_rows(const X &xs) {
    if constexpr (X::NORM) return xs.res; else return xs.x;
}

// SPLIT: grid z = 8, block z computes partial z alone into `part` (GEMM_PART floats a tile and
// partial), and the last of a tile's blocks to finish (counter sem[tile], zero between launches,
// reset by that block) adds the partials in order and stores y: the same sums in the same order,
// eight times the blocks for the few-row steps of the wide decode program.
template <class C, bool SPLIT, class X, class Y>
__device__ __forceinline__ void gemm(const X &xs, const bf16 *__restrict__ W, const Y &ys, int M, int N, int K,
                                     float *__restrict__ part = nullptr, int *__restrict__ sem = nullptr) {
    const GemmMem<C> sm;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3, wm = warp / C::WX, wn = warp % C::WX;
    // Which (W tiles, x rows) this block takes. The split variants: blockIdx as is. Prefill's: the
    // blocks in launch order walk GROUP column tiles down every row tile before the next GROUP, so
    // the blocks resident at once share W tiles and x rows in L2 (any order gives the same bits).
    int bx = blockIdx.x, by = blockIdx.y;
    if constexpr (!SPLIT) {
        constexpr int GROUP = 8;
        const int lin = blockIdx.y * gridDim.x + blockIdx.x, per = GROUP * gridDim.y;
        const int g0 = lin / per * GROUP, width = min(GROUP, (int)gridDim.x - g0), r = lin % per;
        bx = g0 + r % width;
        by = r / width;
    }
    const int tile0 = bx * C::TILES, m0 = by * C::BM;
    const int nu = (K + GEMV_UNIT - 1) / GEMV_UNIT;
    const int p0 = SPLIT ? blockIdx.z : 0, p1 = SPLIT ? p0 + 1 : 8;
    if (SPLIT && units_of(p0, nu) == 0) return;  // no units: the gemv adds this partial's 0
    int n_st = 0;  // this block's stages: its partials' units, 8 / SPS stages each
    for (int p = p0; p < p1; ++p) n_st += units_of(p, nu) * (8 / C::SPS);
    const bf16 *xg = x_rows(xs);

    // This thread's copies a stage: chunk column cc = tid % CPR (step cc / 4 of the stage, 8
    // elements at 8 (cc % 4) of it) of rows tid / CPR + (THREADS / CPR) i: W rows first (BN of
    // them), then x rows.
    constexpr int RSTEP = C::THREADS / C::CPR;
    const int cc = tid % C::CPR, kc = 32 * (cc / 4) + 8 * (cc % 4);
    const bf16 *src[C::CHUNKS];
    int dst[C::CHUNKS];  // element offset in a stage's W (rows < BN) or x region
    bool ok[C::CHUNKS];
#pragma unroll
    for (int i = 0; i < C::CHUNKS; ++i) {
        const int row = copy_row<C>(tid, i);
        if (row < C::BN) {
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
            src[i] = W + (size_t)(ok[i] ? wr : 0) * K + kc;
            dst[i] = (cc / 4) * C::BN * C::KS + row * C::KS + 8 * (cc % 4);
        } else {
            const int xr = m0 + row - C::BN;
            ok[i] = xr < M;
            src[i] = xg + (size_t)(ok[i] ? xr : 0) * K + kc;
            dst[i] = (cc / 4) * C::BM * C::KS + (row - C::BN) * C::KS + 8 * (cc % 4);
        }
    }
    KCursor lc{p0, p0, 0, nu};  // the next stage to load
    auto load = [&](int st) {
        const int k = lc.k();
#pragma unroll
        for (int i = 0; i < C::CHUNKS; ++i) {
            const int row = copy_row<C>(tid, i);
            bf16 *d = (row < C::BN ? sm.w(st) : sm.x(st)) + dst[i];
            const bool in = ok[i] && k + kc < K;  // past K: zeros, as the gemv's loads
            cp_async16_zfill(d, in ? src[i] + k : src[i], in ? 16 : 0);
        }
        lc.next(C::SPS);
    };
#pragma unroll
    for (int i = 0; i < C::STAGES - 1; ++i) {
        if (i < n_st) load(i);
        cp_async_commit();
    }

    float acc[C::WM][C::WN][4], tot[C::WM][C::WN][4];
#pragma unroll
    for (int mi = 0; mi < C::WM; ++mi)
#pragma unroll
        for (int ni = 0; ni < C::WN; ++ni)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mi][ni][e] = tot[mi][ni][e] = 0.f;
    // Normed X: the sum of squares of row tid (tid < BM), in the gemv's order: a unit's 32 lane
    // sums (XNorm::form of 8 elements) by warp_sum's tree, the units of a partial in order
    // (cur), the partials in order (ss).
    float cur = 0.f, ss = 0.f;
    auto unit_done = [&](int parity) {
        if (X::NORM && tid < C::BM) cur += lane_tree(sm.lane_ss(parity, tid));
    };

    KCursor cc_k{p0, p0, 0, nu};  // the stage being computed (the normed x's K offsets)
    int si = 0;                    // its index among the block's stages
    for (int p = p0; p < p1; ++p) {
        const int n_p = units_of(p, nu) * (8 / C::SPS);
        if (n_p == 0) continue;  // the gemv adds this partial's 0: the total does not change
        for (int e = 0; e < n_p; ++e, ++si) {
            cp_async_wait<C::STAGES - 2>();
            const int st = si % C::STAGES;
            const int ue = (si * C::SPS) & 7, parity = ((si * C::SPS) >> 3) & 1;  // step in the unit, unit parity
#pragma unroll
            for (int i = 0; i < C::BN / RSTEP; i += 2)
                pair_words(reinterpret_cast<uint4 *>(sm.w(st) + dst[i]), reinterpret_cast<uint4 *>(sm.w(st) + dst[i + 1]));
            if constexpr (X::NORM) {  // x = bf16(nw * res), formed in place by the thread that copied it
                const int k = cc_k.k() + kc;
                const bool okc = k < K;
                const uint4 nw = xs.weight(okc ? k : 0);
#pragma unroll
                for (int i = 0; i < C::CHUNKS; ++i) {
                    const int row = copy_row<C>(tid, i);
                    if (row >= C::BN) {
                        uint4 *q = reinterpret_cast<uint4 *>(sm.x(st) + dst[i]);
                        float l = 0.f;
                        *q = xs.form(*q, nw, okc, l);
                        sm.lane_ss(parity, row - C::BN)[4 * (ue + cc / 4) + cc % 4] = l;
                    }
                }
            }
            __syncthreads();
            if (X::NORM && ue == 0 && si > 0) {  // the previous unit's lane sums are all in
                unit_done(parity ^ 1);
                if (e == 0) ss += cur, cur = 0.f;  // and it closed a partial
            }
            if (si + C::STAGES - 1 < n_st) load((si + C::STAGES - 1) % C::STAGES);
            cp_async_commit();
            cc_k.next(C::SPS);
#pragma unroll
            for (int j = 0; j < C::SPS; ++j) {
                const bf16 *ws = sm.w(st) + j * C::BN * C::KS, *xs_ = sm.x(st) + j * C::BM * C::KS;
                uint4 xv[C::WN];
#pragma unroll
                for (int ni = 0; ni < C::WN; ++ni)
                    xv[ni] = *reinterpret_cast<const uint4 *>(xs_ + ((wn * C::WN + ni) * 8 + g) * C::KS + 8 * t);
                uint4 a[C::WM], b[C::WM];
#pragma unroll
                for (int mi = 0; mi < C::WM; ++mi) {
                    const bf16 *wr = ws + ((wm * C::WM + mi) * 16 + g) * C::KS + 8 * t;
                    a[mi] = *reinterpret_cast<const uint4 *>(wr);
                    b[mi] = *reinterpret_cast<const uint4 *>(wr + 8 * C::KS);
                }
                // the step's first k16 for every tile, then its second: no mma waits on the one before
#pragma unroll
                for (int mi = 0; mi < C::WM; ++mi)
#pragma unroll
                    for (int ni = 0; ni < C::WN; ++ni)
                        mma_bf16(acc[mi][ni], a[mi].x, a[mi].y, a[mi].z, a[mi].w, xv[ni].x, xv[ni].y);
#pragma unroll
                for (int mi = 0; mi < C::WM; ++mi)
#pragma unroll
                    for (int ni = 0; ni < C::WN; ++ni)
                        mma_bf16(acc[mi][ni], b[mi].x, b[mi].y, b[mi].z, b[mi].w, xv[ni].z, xv[ni].w);
            }
        }
#pragma unroll
        for (int mi = 0; mi < C::WM; ++mi)
#pragma unroll
            for (int ni = 0; ni < C::WN; ++ni)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    tot[mi][ni][e] += acc[mi][ni][e];
                    acc[mi][ni][e] = 0.f;
                }
    }
    cp_async_wait<0>();
    __syncthreads();  // the last unit's lane sums
    unit_done((((si - 1) * C::SPS) >> 3) & 1);
    ss += cur;

    if constexpr (SPLIT) {
        const int tile = blockIdx.y * gridDim.x + blockIdx.x;
        float *mine = part + ((size_t)tile * 8 + p0) * C::PART;
#pragma unroll
        for (int mi = 0; mi < C::WM; ++mi)
#pragma unroll
            for (int ni = 0; ni < C::WN; ++ni)
#pragma unroll
                for (int e = 0; e < 4; ++e) mine[((mi * C::WN + ni) * 4 + e) * C::THREADS + tid] = tot[mi][ni][e];
        if (X::NORM && tid < C::BM) mine[C::FRAG * C::THREADS + tid] = ss;
        __threadfence();
        __syncthreads();
        if (tid == 0) {
            const int n_used = min(8, nu);
            const bool last = atomicAdd(sem + tile, 1) == n_used - 1;
            if (last) atomicExch(sem + tile, 0);
            *sm.merge() = last;
        }
        __syncthreads();
        if (!*sm.merge()) return;
        __threadfence();
        // the partials in order from 0, as the gemv adds its warps' (the empty ones add 0)
        ss = 0.f;
#pragma unroll
        for (int mi = 0; mi < C::WM; ++mi)
#pragma unroll
            for (int ni = 0; ni < C::WN; ++ni)
#pragma unroll
                for (int e = 0; e < 4; ++e) tot[mi][ni][e] = 0.f;
        for (int p = 0; p < min(8, nu); ++p) {
            const float *pp = part + ((size_t)tile * 8 + p) * C::PART;
#pragma unroll
            for (int mi = 0; mi < C::WM; ++mi)
#pragma unroll
                for (int ni = 0; ni < C::WN; ++ni)
#pragma unroll
                    for (int e = 0; e < 4; ++e) tot[mi][ni][e] += __ldcg(pp + ((mi * C::WN + ni) * 4 + e) * C::THREADS + tid);
            if (X::NORM && tid < C::BM) ss += __ldcg(pp + C::FRAG * C::THREADS + tid);
        }
    }
    if constexpr (X::NORM)
        if (tid < C::BM) sm.scale()[tid] = 1.f / sqrtf(ss / (float)K + xs.eps);
    __syncthreads();

    // tot[mi][ni][e]: e = 0, 1 -> (mma row g, x rows 2t, 2t + 1), e = 2, 3 -> (mma row g + 8, same).
#pragma unroll
    for (int mi = 0; mi < C::WM; ++mi) {
        const int tile = tile0 + wm * C::WM + mi;
#pragma unroll
        for (int ni = 0; ni < C::WN; ++ni) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int i = (wn * C::WN + ni) * 8 + 2 * t + e, r = m0 + i;
                if (r >= M) continue;
                const float scale = X::NORM ? sm.scale()[i] : 1.f;
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
extern "C" __global__ void __launch_bounds__(GemmBig::THREADS, 1)
norm_gemm_bf16(const bf16 *__restrict__ res, const bf16 *__restrict__ nw, const bf16 *__restrict__ W,
                          bf16 *__restrict__ y, int rows, int N, int K, float eps) {
    gemm<GemmBig, false>(XNorm{res, nw, eps}, W, YBf16{y}, rows, N, K);
}
extern "C" __global__ void __launch_bounds__(GemmBig::THREADS, 1)
norm_gemm_f32(const bf16 *__restrict__ res, const bf16 *__restrict__ nw, const bf16 *__restrict__ W,
                         float *__restrict__ y, int rows, int N, int K, float eps) {
    gemm<GemmBig, false>(XNorm{res, nw, eps}, W, YF32{y}, rows, N, K);
}
extern "C" __global__ void __launch_bounds__(GemmBig::THREADS, 1)
gemm_residual(const bf16 *__restrict__ x, const bf16 *__restrict__ W, bf16 *res, int rows, int N, int K) {
    gemm<GemmBig, false>(XPlain{x}, W, YAddRes{res}, rows, N, K);
}
extern "C" __global__ void __launch_bounds__(GemmBig::THREADS, 1)
norm_gemm_swiglu(const bf16 *__restrict__ res, const bf16 *__restrict__ nw, const bf16 *__restrict__ W,
                            bf16 *__restrict__ act, int rows, int N, int K, float eps) {
    gemm<GemmBig, false>(XNorm{res, nw, eps}, W, YSwiGLU{act}, rows, N, K);
}
extern "C" __global__ void __launch_bounds__(GemmBig::THREADS, 1)
norm_gemm_rope_append(const bf16 *__restrict__ res, const bf16 *__restrict__ nw,
                                 const bf16 *__restrict__ W, bf16 *__restrict__ y, char *__restrict__ kv_state,
                                 const int *__restrict__ page_table, const int *__restrict__ cu_seqlens,
                                 const int *__restrict__ pos, const float *__restrict__ table, int pages_per_seq,
                                 int rows, int n_seqs, int layer, int n_layers, int n_q_heads, int n_kv_heads,
                                 int head_dim, int page_tokens, int N, int K, float eps) {
    gemm<GemmBig, false>(XNorm{res, nw, eps}, W,
                rope_append_y(y, kv_state, page_table, cu_seqlens, pos, table, pages_per_seq, n_seqs, layer, n_layers, n_q_heads,
                             n_kv_heads, head_dim, page_tokens), rows, N, K);
}

// The wide decode program's (few rows, 8 blocks a tile, one a partial): part f32[tiles * 8 *
// GEMM_PART], sem i32[tiles] (zero before the first launch, zero again after each; tiles = the
// grid's x * y). Grid (ceil_div(tiles, GEMM_TILES), ceil_div(rows, 64), 8), GemmSmall's.
extern "C" __global__ void __launch_bounds__(GemmSmall::THREADS, 4)
norm_gemm_bf16_split(const bf16 *__restrict__ res, const bf16 *__restrict__ nw, const bf16 *__restrict__ W,
                     bf16 *__restrict__ y, float *__restrict__ part, int *__restrict__ sem, int rows, int N, int K,
                     float eps) {
    gemm<GemmSmall, true>(XNorm{res, nw, eps}, W, YBf16{y}, rows, N, K, part, sem);
}
extern "C" __global__ void __launch_bounds__(GemmSmall::THREADS, 4)
gemm_residual_split(const bf16 *__restrict__ x, const bf16 *__restrict__ W, bf16 *res, float *__restrict__ part,
                    int *__restrict__ sem, int rows, int N, int K) {
    gemm<GemmSmall, true>(XPlain{x}, W, YAddRes{res}, rows, N, K, part, sem);
}
extern "C" __global__ void __launch_bounds__(GemmSmall::THREADS, 4)
norm_gemm_swiglu_split(const bf16 *__restrict__ res, const bf16 *__restrict__ nw, const bf16 *__restrict__ W,
                       bf16 *__restrict__ act, float *__restrict__ part, int *__restrict__ sem, int rows, int N, int K,
                       float eps) {
    gemm<GemmSmall, true>(XNorm{res, nw, eps}, W, YSwiGLU{act}, rows, N, K, part, sem);
}
extern "C" __global__ void __launch_bounds__(GemmSmall::THREADS, 4)
norm_gemm_rope_append_split(const bf16 *__restrict__ res, const bf16 *__restrict__ nw,
                            const bf16 *__restrict__ W, bf16 *__restrict__ y, char *__restrict__ kv_state,
                            const int *__restrict__ page_table, const int *__restrict__ cu_seqlens,
                            const int *__restrict__ pos, const float *__restrict__ table, float *__restrict__ part,
                            int *__restrict__ sem, int pages_per_seq, int rows, int n_seqs, int layer, int n_layers,
                            int n_q_heads, int n_kv_heads, int head_dim, int page_tokens, int N, int K, float eps) {
    gemm<GemmSmall, true>(XNorm{res, nw, eps}, W,
               rope_append_y(y, kv_state, page_table, cu_seqlens, pos, table, pages_per_seq, n_seqs, layer, n_layers, n_q_heads,
                             n_kv_heads, head_dim, page_tokens), rows, N, K, part, sem);
}
