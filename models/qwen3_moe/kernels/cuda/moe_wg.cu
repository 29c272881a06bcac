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
// gemm_wg.cuh's producer with the block's x rows gathered: tile row i is a_row(i) (nullptr: no
// row); the W rows, the stages and their order are wg_produce's. A tile row past the tile's
// positions is not copied at all: its shared memory keeps whatever an earlier stage left, which
// reaches only that row's own outputs (an MMA's output row r reads only row r of x), and those are
// never stored. At 16-64 decode rows a tile holds 1-8 positions of its 64, so the producer's copies
// and shared-memory writes are the expert's W rows and little else. i: the ring's stage count so
// far (the block's earlier work items); returns it after this item's stages.
template <class C, class Y, class ARow>
__device__ __forceinline__ int wg_produce_rows(const ARow &a_row, const bf16 *__restrict__ W, const Y &ys,
                                               char *ring, uint64_t *full, uint64_t *empty, int q0, int N, int K,
                                               int i) {
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
                    if (aok[j]) cp_async16_zfill(a + sw128(r0 + 16 * j, c), ap[j] + (kok ? k : 0), kok ? 16 : 0);
#pragma unroll
                for (int j = 0; j < BR; ++j)
                    cp_async16_zfill(bt + sw128(r0 + 16 * j, c), bp[j] + (kok ? k : 0), bok[j] && kok ? 16 : 0);
                cp_async_arrive(&full[s]);
            }
    return i;
}

// moe_sort's tiles as work items: item it is tile it / cols beside column tile it % cols. A
// block reads its next item's tile while it works on this one (a read after an item ended was a
// memory latency an item with the ring full and the consumer waiting: a sixth of a down
// projection's item at 16 rows). The tiles and sorted[] are read at L2 (__ldcg), as everything
// these kernels read that an earlier kernel wrote: they launch with programmatic dependent
// launch, and an SM's L1 may hold lines from before the previous kernel's writes (gemv.cuh).
struct MoeItems {
    const int *tiles;
    int first, count, cols;
    __device__ int n() const { return __ldcg(tiles) * cols; }
    // tile it / cols's (expert less first, start, end); e is out of [0, count) past n or where the
    // expert is not held here (expert parallel)
    __device__ int3 load(int it, int n) const {
        if (it >= n) return make_int3(-1, 0, 0);
        const int t = it / cols;
        return make_int3(__ldcg(tiles + 1 + 3 * t) - first, __ldcg(tiles + 2 + 3 * t), __ldcg(tiles + 3 + 3 * t));
    }
    __device__ bool held(int3 w) const { return w.x >= 0 && w.x < count; }
};

// YRowsF32's store (moe_wg_down): wg_store's layout, each of a thread's two rows' destination
// (list[r], -1 past the tile) read before the item's K loop, so its latency hides under the loop.
template <class C>
__device__ __forceinline__ void wg_rows_of(const YRowsF32 &ys, int wg, int s0, int s1, int (&dst)[2]) {
    const int lane = threadIdx.x & 31, w = (threadIdx.x >> 5) & 3;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = s0 + wg * 64 + 16 * w + (lane >> 2) + 8 * h;
        dst[h] = r < s1 ? __ldcg(ys.list + r) : -1;
    }
}
template <class C>
__device__ __forceinline__ void wg_store_rows(const float (&tot)[C::ACC], const YRowsF32 &ys, const int (&dst)[2],
                                              int q0, int N) {
    const int t = threadIdx.x & 3;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        if (dst[h] < 0) continue;
        float *row = ys.y + (size_t)dst[h] * N;
#pragma unroll
        for (int j = 0; j < C::BN / 8; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int col = q0 + 8 * j + 2 * t + e;
                if (col < N) row[col] = tot[4 * j + 2 * h + e];
            }
    }
}

// A grouped projection, persistent: block b takes work items b, b + gridDim.x, ... (a tile's
// sorted positions [s0, s1), its rows rows(s0, s1, i), beside one column tile of its expert's W
// [N, K] at W + e * w_expert), each the whole K in gemm_wg's order, stored through ys at rows
// s0 .. s1 - 1. The producer runs on into the next item's stages while the consumer finishes an
// item and stores it, so the ring never drains between items, and a block starts once a launch
// (at 16-64 decode rows an item's W is 192-512 KB: as a block of its own, the ring's first fill
// and last drain were a third of a short one's time). Dynamic shared memory C::SMEM.
template <class C, class Y, class Rows>
__device__ __forceinline__ void grouped_wg(const MoeItems &items, const Rows &rows, const bf16 *__restrict__ W,
                                           size_t w_expert, const Y &ys, int N, int K) {
    extern __shared__ char moe_smem_raw[];
    char *ring = reinterpret_cast<char *>((reinterpret_cast<uintptr_t>(moe_smem_raw) + 1023) & ~uintptr_t(1023));
    uint64_t *full = reinterpret_cast<uint64_t *>(ring + C::STAGES * C::STAGE), *empty = full + C::STAGES;
    if (threadIdx.x == 0) {
        for (int s = 0; s < C::STAGES; ++s) {
            mbar_init(&full[s], 128);
            mbar_init(&empty[s], 128 * C::NWG);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    const int wg = threadIdx.x / 128 - 1, n = items.n();
    constexpr bool scattered = std::is_same_v<Y, YRowsF32>;
    int i = 0, it = blockIdx.x;
    for (int3 cur = items.load(it, n); it < n; it += gridDim.x) {
        const int3 next = items.load(it + gridDim.x, n);
        if (items.held(cur)) {
            const int e = cur.x, s0 = cur.y, s1 = cur.z;
            const int q0 = (it % items.cols) * (Y::PAIRED ? C::BN / 2 : C::BN);
            if (wg < 0) {
                const auto a_row = [&](int r) { return rows(s0, s1, r); };
                i = wg_produce_rows<C>(a_row, W + (size_t)e * w_expert, ys, ring, full, empty, q0, N, K, i);
            } else {
                int dst[2];
                if constexpr (scattered) wg_rows_of<C>(ys, wg, s0, s1, dst);
                float tot[C::ACC];
#pragma unroll
                for (int j = 0; j < C::ACC; ++j) tot[j] = 0.f;
                i = wg_consume<C>(tot, ring, full, empty, wg, K, 0, WG_PARTS, i);
                if constexpr (scattered)
                    wg_store_rows<C>(tot, ys, dst, q0, N);
                else
                    wg_store<C>(tot, ys, nullptr, wg, s0, q0, s1, N);
            }
        }
        cur = next;
    }
    if (wg < 0) asm volatile("cp.async.wait_all;" ::: "memory");
}

// act[s, c] = swiglu(x[sorted[s] / top_k] . gate_e[c], ... . up_e[c]) for the sorted positions s
// of every tile. Grid (MOE_WG_BLOCKS), block WgExpert::THREADS.
extern "C" __global__ void __launch_bounds__(WgExpert::THREADS, 1)
moe_wg_gate_up(const bf16 *__restrict__ x, const int *__restrict__ sorted, const int *__restrict__ tiles,
               const bf16 *__restrict__ W, bf16 *__restrict__ act, int top_k, int inter, int hidden, int first,
               int count) {
    pdl_wait();  // moe_route_sort's tiles (or moe_sort's: then a no-op) before anything is read
    pdl_launch_dependents();
    const auto rows = [&](int s0, int s1, int i) -> const bf16 * {
        return s0 + i < s1 ? x + (size_t)(__ldcg(sorted + s0 + i) / top_k) * hidden : nullptr;
    };
    const MoeItems items{tiles, first, count, (inter + WgExpert::BN / 2 - 1) / (WgExpert::BN / 2)};
    grouped_wg<WgExpert>(items, rows, W, (size_t)2 * inter * hidden, YActSwiGLU{act, nullptr}, inter, hidden);
}

// y[sorted[s], c] = act[s] . down_e[c] (f32): each pair's expert output in its own row. Grid
// (MOE_WG_BLOCKS), block WgExpert::THREADS.
extern "C" __global__ void __launch_bounds__(WgExpert::THREADS, 1)
moe_wg_down(const bf16 *__restrict__ act, const int *__restrict__ sorted, const int *__restrict__ tiles,
            const bf16 *__restrict__ W, float *__restrict__ y, int hidden, int inter, int first, int count) {
    pdl_wait();  // gate_up's act
    pdl_launch_dependents();
    const auto rows = [&](int s0, int s1, int i) -> const bf16 * {
        return s0 + i < s1 ? act + (size_t)(s0 + i) * inter : nullptr;
    };
    const MoeItems items{tiles, first, count, (hidden + WgExpert::BN - 1) / WgExpert::BN};
    grouped_wg<WgExpert>(items, rows, W, (size_t)hidden * inter, YRowsF32{y, sorted, hidden}, hidden, inter);
}

// The router's logits for many rows: y [rows, N] f32 = x . W, gemv_f32's order. Grid
// (ceil_div(N, WG_BN), ceil_div(rows, 64)), block WgExpert::THREADS.
extern "C" __global__ void __launch_bounds__(WgExpert::THREADS, 1)
moe_router_gemm(const bf16 *__restrict__ x, const bf16 *__restrict__ W, float *__restrict__ y, int rows, int N,
                int K) {
    gemm_wg<WgExpert>(x, W, nullptr, YF32{y}, rows, N, K);
}

// The same logits for the wide decode's few rows: gemm_wg's split (grid z = WG_PARTS, a block a
// partial; the last of a tile's blocks adds the 8 in order: moe_router_gemm's bits), 8 blocks
// where the router's one column tile of 128 experts gave one block its whole K. part: scratch
// floats a (tile, partial) WgExpert::PART; sem: a counter a tile, zero between launches. Grid
// (ceil_div(N, WG_BN), ceil_div(rows, 64), WG_PARTS), block WgExpert::THREADS.
extern "C" __global__ void __launch_bounds__(WgExpert::THREADS, 1)
moe_router_gemm_split(const bf16 *__restrict__ x, const bf16 *__restrict__ W, float *__restrict__ y,
                      float *__restrict__ part, int *sem, int rows, int N, int K) {
    gemm_wg<WgExpert>(x, W, nullptr, YF32{y}, rows, N, K, part, sem);
}

// ---- the combine ---------------------------------------------------------------------------
// sum over j in order of weights[r, j] * bf16(y[r * top_k + j, n]), the choices held here.
__device__ __forceinline__ float choice_sum(const float *__restrict__ y, const int *__restrict__ ids,
                                            const float *__restrict__ weights, int r, int n, int top_k, int hidden,
                                            int first, int count) {
    float acc = 0.f;
    for (int j = 0; j < top_k; ++j) {
        const int pair = r * top_k + j, e = __ldcg(ids + pair) - first;
        if (e >= 0 && e < count) acc = fmaf(__ldcg(weights + pair), rbf(__ldcg(y + (size_t)pair * hidden + n)), acc);
    }
    return acc;
}

// res[r, n] = bf16(res + bf16(choice_sum)): the MoE output rounded as transformers' bf16 block
// leaves it, added into the residual as llama's YAddRes adds a projection. Grid (rows,
// ceil_div(hidden, 256)), block 256.
extern "C" __global__ void __launch_bounds__(256)
moe_combine_residual(const float *__restrict__ y, const int *__restrict__ ids, const float *__restrict__ weights,
                     bf16 *res, int rows, int top_k, int hidden, int first, int count) {
    pdl_wait();  // down's y
    pdl_launch_dependents();
    const int r = blockIdx.x, n = blockIdx.y * blockDim.x + threadIdx.x;
    if (r >= rows || n >= hidden) return;
    const float acc = choice_sum(y, ids, weights, r, n, top_k, hidden, first, count);
    res[(size_t)r * hidden + n] = to_bf(to_f(__ldcg(res + (size_t)r * hidden + n)) + rbf(acc));
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
