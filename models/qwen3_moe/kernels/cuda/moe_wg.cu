// The Qwen3-MoE block, batch-invariant by construction (sm_90a; KERNELS.md, docs/determinism.md):
// every router logit and every expert output is reduced in the one K order of llama's gemv.cuh
// and common gemm_wg.cuh (K in units of 256, partial p taking units p, p + 8, ..., each a chain
// of k16 steps of 16 consecutive elements, the 8 partials added in order from 0), whichever
// kernel computes it and whatever rows share its expert, its tile or its step; the top-k outputs
// of a row are weighted and summed in choice order by one thread an element. So a row's bits
// depend on the row alone (and the weights), never on its batch, its chunking or a cache hit.
//
// Narrow decode (few rows): moe_gather_gate_up / moe_gather_down, a block a (chosen expert,
// column tile), the expert's W rows streamed once for every pair that chose it, on mma.sync
// through llama's gemv (the pass's rows gathered by pair). Wide decode and prefill: moe_sort's
// tiles (moe.cu) on wgmma: moe_wg_gate_up / moe_wg_down, a block a (tile, column tile), the
// tile's x rows gathered on the fly by a producer warpgroup, one consumer warpgroup running
// gemm_wg.cuh's chains (the same k16 sets, the same partial order: the gemv's bits). Both write
// f32 expert outputs by pair, and moe_combine_residual adds each row's weighted sum (bf16) into
// the residual stream. moe_router_gemm is the router's logits for many rows (the gemv_f32 of
// narrow decode, in its order). No float atomics; moe_sort's integer counts are exact.
#include "gemv.cuh"
#include "gemm_wg.cuh"
#include "moe_pairs.cuh"

#if !defined(MOE_BM) || !defined(WG_BN) || !defined(WG_SPLIT_SMEM)
#error "build with kern_models.common.cubins: the tile constants come from the family's table.py"
#endif

// One of moe_sort's tiles (64 positions), or 64 router rows, beside 128 W rows; 8 stages. The
// router's 128 experts are one column tile: 64 rows a block spread a wide decode's few rows over
// more blocks than llama's 128.
using WgExpert = WgCfg<WG_BN, 1, 8>;
static_assert(WgExpert::SMEM == WG_SPLIT_SMEM, "table.py's WG_* constants");
static_assert(WgExpert::BM == MOE_BM, "a block's x rows are one tile of moe_sort");

// ---- gathered rows and scattered outputs ------------------------------------------------------
// A gemv pass's row i is x row list[i] / div (a pair's token: div = top_k; a pair's own row: 1).
struct XRows {
    static constexpr bool NORM = false;
    const bf16 *x;
    const int *list;
    int div;
    __device__ XRows after() const { return {after_wait(x), list, div}; }
    __device__ uint4 operand(int i, int k, int t, int K) const {
        return step_operand([](const bf16 *p) { return ld_act8(p); }, x + (size_t)(list[i] / div) * K + k, k, t, K);
    }
};
// SwiGLU of an expert's [gate; up] rows (N = inter: pair q is gate row q and up row N + q), as
// llama's YSwiGLU rounds it; row i's output is act row list[i] (list nullptr: row i).
struct YActSwiGLU {
    static constexpr bool PAIRED = true;
    bf16 *act;
    const int *list;
    __device__ bool wrows(int tile, int g, int N, int &w0, int &w1) const {
        w0 = (GEMV_COLS / 2) * tile + g;
        w1 = N + w0;
        return w0 < N;
    }
    __device__ void put(int i, int tile, int g, int N, float gate, float up) const {
        const float gs = rbf(gate);
        act[(size_t)(list ? list[i] : i) * N + (GEMV_COLS / 2) * tile + g] =
            to_bf(rbf(gs / (1.f + expf(-gs))) * rbf(up));
    }
};
// f32 outputs whose row i is y row list[i] (a pair's row): put gets i * N + column.
struct YRowsF32 {
    static constexpr bool PAIRED = false;
    float *y;
    const int *list;
    int N;
    __device__ void put(size_t at, float v) const {
        const int i = (int)(at / (size_t)N), c = (int)(at - (size_t)i * N);
        y[(size_t)list[i] * N + c] = v;
    }
};

// ---- narrow decode: the chosen experts' rows, read once an expert ------------------------------
// act[pair, c] = swiglu(x[r] . gate_e[c], x[r] . up_e[c]) for every pair (r * top_k + j) that
// chose expert e = the blockIdx.y-th chosen one (expert_pairs; experts first .. first + count - 1
// held here). Grid (ceil_div(inter, GEMV_COLS / 2), rows * top_k), block 32 * GEMV_WARPS; the
// blocks past the last chosen expert return at once.
extern "C" __global__ void __launch_bounds__(32 * GEMV_WARPS)
moe_gather_gate_up(const bf16 *__restrict__ x, const int *__restrict__ ids, const bf16 *__restrict__ W,
                   bf16 *__restrict__ act, int rows, int top_k, int inter, int hidden, int first, int count) {
    __shared__ int list[MOE_GEMV_MAX_PAIRS];
    if ((int)blockIdx.y >= count) return;
    int n;
    const int e = expert_pairs(ids, rows * top_k, first, count, list, n);
    if (e < 0) return;
    gemv(XRows{x, list, top_k}, W + (size_t)e * 2 * inter * hidden, YActSwiGLU{act, list}, n, inter, hidden);
}

// y[pair, c] = act[pair] . down_e[c] (f32) for every pair that chose the blockIdx.y-th chosen
// expert. Grid (ceil_div(hidden, GEMV_COLS), rows * top_k), block 32 * GEMV_WARPS.
extern "C" __global__ void __launch_bounds__(32 * GEMV_WARPS)
moe_gather_down(const bf16 *__restrict__ act, const int *__restrict__ ids, const bf16 *__restrict__ W,
                float *__restrict__ y, int rows, int top_k, int hidden, int inter, int first, int count) {
    __shared__ int list[MOE_GEMV_MAX_PAIRS];
    if ((int)blockIdx.y >= count) return;
    int n;
    const int e = expert_pairs(ids, rows * top_k, first, count, list, n);
    if (e < 0) return;
    gemv(XRows{act, list, 1}, W + (size_t)e * hidden * inter, YRowsF32{y, list, hidden}, n, hidden, inter);
}

// ---- wide decode and prefill: moe_sort's tiles on wgmma ----------------------------------------
// gemm_wg.cuh's producer with the block's x rows gathered: tile row i is a_row(i) (nullptr: a
// zero row); the W rows, the stages and their order are wg_produce's.
template <class C, class Y, class ARow>
__device__ __forceinline__ void wg_produce_rows(const ARow &a_row, const bf16 *__restrict__ W, const Y &ys,
                                                char *ring, uint64_t *full, uint64_t *empty, int q0, int N, int K) {
    const int tid = threadIdx.x, c = tid & 7, r0 = tid >> 3;
    const int nu = (K + WG_UNIT - 1) / WG_UNIT;
    constexpr int AR = C::BM / 16, BR = C::BN / 16;
    const bf16 *ap[AR], *bp[BR];
    bool aok[AR], bok[BR];
#pragma unroll
    for (int j = 0; j < AR; ++j) {
        const bf16 *row = a_row(r0 + 16 * j);
        aok[j] = row != nullptr;
        ap[j] = (aok[j] ? row : W) + 8 * c;
    }
#pragma unroll
    for (int j = 0; j < BR; ++j) {
        const int b = r0 + 16 * j;
        int w;
        if constexpr (Y::PAIRED) {
            const int q = q0 + (b % (C::BN / 2));
            int w0, w1;
            bok[j] = ys.wrows(q >> 3, q & 7, N, w0, w1);
            w = b < C::BN / 2 ? w0 : w1;
        } else {
            w = q0 + b;
            bok[j] = w < N;
        }
        bp[j] = W + (size_t)(bok[j] ? w : 0) * K + 8 * c;
    }
    int i = 0;
    for (int p = 0; p < WG_PARTS; ++p)
        for (int u = p; u < nu; u += WG_PARTS)
            for (int sub = 0; sub < WG_UNIT / WG_BK; ++sub, ++i) {
                const int s = i % C::STAGES, n = i / C::STAGES;
                if (n > 0) mbar_wait(&empty[s], (n - 1) & 1);
                const int k = u * WG_UNIT + sub * WG_BK;
                const bool kok = k + 8 * c < K;
                char *a = ring + s * C::STAGE, *bt = a + C::A_BYTES;
#pragma unroll
                for (int j = 0; j < AR; ++j)
                    cp_async16_zfill(a + sw128(r0 + 16 * j, c), ap[j] + (kok ? k : 0), aok[j] && kok ? 16 : 0);
#pragma unroll
                for (int j = 0; j < BR; ++j)
                    cp_async16_zfill(bt + sw128(r0 + 16 * j, c), bp[j] + (kok ? k : 0), bok[j] && kok ? 16 : 0);
                cp_async_arrive(&full[s]);
            }
}

// One block of a grouped projection: the tile's sorted positions [s0, s1) (its rows a_row(i) =
// position s0 + i) beside column tile blockIdx.x of W [N, K], the whole K in gemm_wg's order,
// stored through ys at rows s0 .. s1 - 1. Dynamic shared memory C::SMEM.
template <class C, class Y, class ARow>
__device__ __forceinline__ void grouped_wg(const ARow &a_row, const bf16 *__restrict__ W, const Y &ys, int s0,
                                           int s1, int N, int K) {
    extern __shared__ char moe_smem_raw[];
    char *ring = reinterpret_cast<char *>((reinterpret_cast<uintptr_t>(moe_smem_raw) + 1023) & ~uintptr_t(1023));
    uint64_t *full = reinterpret_cast<uint64_t *>(ring + C::STAGES * C::STAGE), *empty = full + C::STAGES;
    const int q0 = blockIdx.x * (Y::PAIRED ? C::BN / 2 : C::BN);
    if (threadIdx.x == 0) {
        for (int s = 0; s < C::STAGES; ++s) {
            mbar_init(&full[s], 128);
            mbar_init(&empty[s], 128 * C::NWG);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    const int wg = threadIdx.x / 128 - 1;
    if (wg < 0) {
        wg_produce_rows<C>(a_row, W, ys, ring, full, empty, q0, N, K);
        asm volatile("cp.async.wait_all;" ::: "memory");
        return;
    }
    float tot[C::ACC];
#pragma unroll
    for (int j = 0; j < C::ACC; ++j) tot[j] = 0.f;
    wg_consume<C>(tot, ring, full, empty, wg, K, 0, WG_PARTS);
    wg_store<C>(tot, ys, nullptr, wg, s0, q0, s1, N);
}

// Tile blockIdx.y of moe_sort's `tiles`: its expert (less first) and positions; false when there
// is no such tile or its expert is not held here.
__device__ __forceinline__ bool moe_tile(const int *__restrict__ tiles, int first, int count, int &e, int &s0,
                                         int &s1) {
    const int i = blockIdx.y;
    if (i >= tiles[0]) return false;
    e = tiles[1 + 3 * i] - first;
    s0 = tiles[2 + 3 * i];
    s1 = tiles[3 + 3 * i];
    return e >= 0 && e < count;
}

// act[s, c] = swiglu(x[sorted[s] / top_k] . gate_e[c], ... . up_e[c]) for the sorted positions s
// of tile blockIdx.y. Grid (ceil_div(inter, WG_BN / 2), max_tiles), block WgExpert::THREADS.
extern "C" __global__ void __launch_bounds__(WgExpert::THREADS, 1)
moe_wg_gate_up(const bf16 *__restrict__ x, const int *__restrict__ sorted, const int *__restrict__ tiles,
               const bf16 *__restrict__ W, bf16 *__restrict__ act, int top_k, int inter, int hidden, int first,
               int count) {
    int e, s0, s1;
    if (!moe_tile(tiles, first, count, e, s0, s1)) return;
    const auto a_row = [&](int i) -> const bf16 * {
        return s0 + i < s1 ? x + (size_t)(sorted[s0 + i] / top_k) * hidden : nullptr;
    };
    grouped_wg<WgExpert>(a_row, W + (size_t)e * 2 * inter * hidden, YActSwiGLU{act, nullptr}, s0, s1, inter, hidden);
}

// y[sorted[s], c] = act[s] . down_e[c] (f32): each pair's expert output in its own row. Grid
// (ceil_div(hidden, WG_BN), max_tiles), block WgExpert::THREADS.
extern "C" __global__ void __launch_bounds__(WgExpert::THREADS, 1)
moe_wg_down(const bf16 *__restrict__ act, const int *__restrict__ sorted, const int *__restrict__ tiles,
            const bf16 *__restrict__ W, float *__restrict__ y, int hidden, int inter, int first, int count) {
    int e, s0, s1;
    if (!moe_tile(tiles, first, count, e, s0, s1)) return;
    const auto a_row = [&](int i) -> const bf16 * { return s0 + i < s1 ? act + (size_t)(s0 + i) * inter : nullptr; };
    grouped_wg<WgExpert>(a_row, W + (size_t)e * hidden * inter, YRowsF32{y, sorted, hidden}, s0, s1, hidden, inter);
}

// The router's logits for many rows: y [rows, N] f32 = x . W, gemv_f32's order. Grid
// (ceil_div(N, WG_BN), ceil_div(rows, 64)), block WgExpert::THREADS.
extern "C" __global__ void __launch_bounds__(WgExpert::THREADS, 1)
moe_router_gemm(const bf16 *__restrict__ x, const bf16 *__restrict__ W, float *__restrict__ y, int rows, int N,
                int K) {
    gemm_wg<WgExpert>(x, W, nullptr, YF32{y}, rows, N, K);
}

// ---- the combine ---------------------------------------------------------------------------
// sum over j in order of weights[r, j] * bf16(y[r * top_k + j, n]), the choices held here.
__device__ __forceinline__ float choice_sum(const float *__restrict__ y, const int *__restrict__ ids,
                                            const float *__restrict__ weights, int r, int n, int top_k, int hidden,
                                            int first, int count) {
    float acc = 0.f;
    for (int j = 0; j < top_k; ++j) {
        const int pair = r * top_k + j, e = ids[pair] - first;
        if (e >= 0 && e < count) acc = fmaf(weights[pair], rbf(y[(size_t)pair * hidden + n]), acc);
    }
    return acc;
}

// res[r, n] = bf16(res + bf16(choice_sum)): the MoE output rounded as transformers' bf16 block
// leaves it, added into the residual as llama's YAddRes adds a projection. Grid (rows,
// ceil_div(hidden, 256)), block 256.
extern "C" __global__ void __launch_bounds__(256)
moe_combine_residual(const float *__restrict__ y, const int *__restrict__ ids, const float *__restrict__ weights,
                     bf16 *res, int rows, int top_k, int hidden, int first, int count) {
    const int r = blockIdx.x, n = blockIdx.y * blockDim.x + threadIdx.x;
    if (r >= rows || n >= hidden) return;
    const float acc = choice_sum(y, ids, weights, r, n, top_k, hidden, first, count);
    res[(size_t)r * hidden + n] = to_bf(to_f(res[(size_t)r * hidden + n]) + rbf(acc));
}

// Expert parallel: this rank's choice_sum (f32) into slot `rank` of every rank's recv buffer
// ([2 halves][ranks][rows][hidden] at `offset`), for the dense family's all_reduce_add_local
// (manifests/ep.py). Grid and block as moe_combine_residual's.
extern "C" __global__ void __launch_bounds__(256)
moe_combine_push(const float *__restrict__ y, const int *__restrict__ ids, const float *__restrict__ weights,
                 float *recv, const unsigned long long *__restrict__ parts, int rows, int top_k, int hidden, int first,
                 int count, int rank, int ranks, int offset) {
    const int r = blockIdx.x, n = blockIdx.y * blockDim.x + threadIdx.x;
    if (r >= rows || n >= hidden) return;
    const float acc = choice_sum(y, ids, weights, r, n, top_k, hidden, first, count);
    const size_t at = (size_t)offset + ((size_t)rank * rows + r) * hidden + n;
    for (int p = 0; p < ranks; ++p) (p == rank ? recv : reinterpret_cast<float *>(parts[p]))[at] = acc;
}
