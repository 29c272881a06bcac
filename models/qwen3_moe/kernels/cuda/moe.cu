// The Qwen3-MoE block on sm_90a (bf16 storage, fp32 math). KERNELS.md beside this file says
// what each computes; table.py holds their launch contracts.
//
// The router: moe_route (softmax over every expert, the top k with ties to the lowest expert
// index, the cpu reference's rule, optionally renormalized).
// Narrow decode reads only the chosen experts: moe_gemv_gate_up (one block a (row, choice) and
// a slice of the expert's width: [gate; up] rows of that expert only, SwiGLU) and
// moe_gemv_down_residual (each row's choices reduced in choice order, added into the residual).
// Wide decode and prefill group the (row, choice) pairs by expert: moe_sort (a stable counting
// sort: each expert's pairs in row order, and tiles of MOE_BM pairs that never cross an
// expert), moe_group_gate_up / moe_group_down (a grouped GEMM on tensor cores over the
// tiles, the rows gathered on the fly) and moe_combine (each row's choices weighted and summed
// in choice order).
// Every reduction has a fixed order (lanes by xor tree, choices in order), so the same inputs
// give the same bits; no float atomics.
#include <mma.h>

#include "common.cuh"
#include "moe_pairs.cuh"

#if !defined(MOE_BM) || !defined(MOE_BN) || !defined(MOE_BK) || !defined(MOE_COLS)
#error "build with kern_models.common.cubins: the tile constants come from the family's table.py"
#endif

using namespace nvcuda;

// ---- the router ------------------------------------------------------------------------------
// One warp a row; experts <= MOE_MAX_EXPERTS (moe_pairs.cuh), top_k <= 32. p: the warp's
// `experts` floats of shared scratch. The logits are read at L2 (__ldcg): under programmatic
// dependent launch (moe_route_sort) an L1 line may predate the router's writes (gemv.cuh).
// Returns lane j's choice j (its expert in id, its weight in w); lanes past top_k return -1.
__device__ __forceinline__ int route_row(const float *__restrict__ l, float *p, int experts, int top_k,
                                         int norm_topk, float &w) {
    const int lane = threadIdx.x & 31;
    float m = -INFINITY;
    for (int e = lane; e < experts; e += 32) m = fmaxf(m, __ldcg(l + e));
    m = warp_max(m);
    float s = 0.f;
    for (int e = lane; e < experts; e += 32) {
        p[e] = expf(__ldcg(l + e) - m);
        s += p[e];
    }
    s = warp_sum(s);
    for (int e = lane; e < experts; e += 32) p[e] = p[e] / s;
    __syncwarp();
    float mine = 0.f, total = 0.f;  // lane j keeps the j-th choice's probability
    int mine_id = 0;
    for (int j = 0; j < top_k; ++j) {
        float best = -1.f;
        int at = experts;
        for (int e = lane; e < experts; e += 32)
            if (p[e] > best) { best = p[e]; at = e; }  // ascending e: a tie keeps the lower index
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ob = __shfl_xor_sync(0xffffffffu, best, o);
            const int oa = __shfl_xor_sync(0xffffffffu, at, o);
            if (ob > best || (ob == best && oa < at)) { best = ob; at = oa; }
        }
        if (lane == j) { mine = best; mine_id = at; }
        total += best;  // every lane holds the same best: the sum in choice order
        __syncwarp();
        if (lane == 0) p[at] = -2.f;  // taken
        __syncwarp();
    }
    w = norm_topk ? mine / total : mine;
    return lane < top_k ? mine_id : -1;
}

// Grid (rows), block 32.
extern "C" __global__ void __launch_bounds__(32)
moe_route(const float *__restrict__ logits, int *__restrict__ ids, float *__restrict__ weights, int rows,
          int experts, int top_k, int norm_topk) {
    __shared__ float p[MOE_MAX_EXPERTS];
    const int r = blockIdx.x, lane = threadIdx.x;
    if (r >= rows) return;
    float w;
    const int id = route_row(logits + (size_t)r * experts, p, experts, top_k, norm_topk, w);
    if (lane < top_k) {
        ids[(size_t)r * top_k + lane] = id;
        weights[(size_t)r * top_k + lane] = w;
    }
}

// ---- narrow decode: only the chosen experts' rows are read --------------------------------------
// A warp a column; a block MOE_COLS columns (32 * MOE_COLS threads). Batch-1 decode is a stream
// of weight rows, and a row of the down projection is only 768 long (3 chunks of 16 bytes a
// lane): so each warp walks the rows it needs (gate and up; or every choice's down row) side by
// side, one chunk of each row in flight together, and reduces after (the lane partials first,
// the xor trees last). A warp then waits on memory ceil(K / 256) times, not that many times a row.

// Lane partials of N dot products of bf16 rows x[q] . w[q] over K (K % 8 == 0), the rows with
// on[q] false skipped (their partial stays 0): each partial takes this lane's 16-byte chunks
// lane, lane + 32, ... in that order, whatever N is, so warp_sum of it is the dot product the
// one-row loop gave (the same bits on every run).
template <int N>
__device__ __forceinline__ void lane_dots(const bf16 *const (&x)[N], const bf16 *const (&w)[N], const bool (&on)[N],
                                          int K, float (&acc)[N]) {
#pragma unroll
    for (int q = 0; q < N; ++q) acc[q] = 0.f;
    for (int i = threadIdx.x & 31; i < (K >> 3); i += 32) {
        uint4 xv[N], wv[N];
#pragma unroll
        for (int q = 0; q < N; ++q)  // every row's chunk requested before any is used
            if (on[q]) {
                xv[q] = reinterpret_cast<const uint4 *>(x[q])[i];
                wv[q] = reinterpret_cast<const uint4 *>(w[q])[i];
            }
#pragma unroll
        for (int q = 0; q < N; ++q)
            if (on[q]) {
                float a[8], b[8];
                unpack8(xv[q], a);
                unpack8(wv[q], b);
#pragma unroll
                for (int t = 0; t < 8; ++t) acc[q] = fmaf(a[t], b[t], acc[q]);
            }
    }
}

// SwiGLU as the dense path and transformers in bf16 round it: silu of the bf16 gate, rounded,
// times the bf16 up, rounded.
__device__ __forceinline__ bf16 swiglu(float gate, float up) {
    const float g = rbf(gate);
    return to_bf(rbf(g / (1.f + expf(-g))) * rbf(up));
}

// Lane partials acc[w][q] of the dot products x[q] . W[w] of R weight rows with G bf16 rows x
// over K (K % 8 == 0), the x rows with on[q] false skipped: each weight chunk is read once for
// every x row (the x rows are few and hot in L1), and each partial takes this lane's chunks
// lane, lane + 32, ... in order: the bits of lane_dots' one-pair loop.
template <int R, int G>
__device__ __forceinline__ void lane_dots_shared(const bf16 *const (&W)[R], const bf16 *const (&x)[G],
                                                 const bool (&on)[G], int K, float (&acc)[R][G]) {
#pragma unroll
    for (int w = 0; w < R; ++w)
#pragma unroll
        for (int q = 0; q < G; ++q) acc[w][q] = 0.f;
#pragma unroll 2
    for (int i = threadIdx.x & 31; i < (K >> 3); i += 32) {
        uint4 wv[R], xv[G];
#pragma unroll
        for (int w = 0; w < R; ++w) wv[w] = reinterpret_cast<const uint4 *>(W[w])[i];
#pragma unroll
        for (int q = 0; q < G; ++q)
            if (on[q]) xv[q] = reinterpret_cast<const uint4 *>(x[q])[i];
#pragma unroll
        for (int w = 0; w < R; ++w) {
            float b[8];
            unpack8(wv[w], b);
#pragma unroll
            for (int q = 0; q < G; ++q)
                if (on[q]) {
                    float a[8];
                    unpack8(xv[q], a);
#pragma unroll
                    for (int t = 0; t < 8; ++t) acc[w][q] = fmaf(a[t], b[t], acc[w][q]);
                }
        }
    }
}

// act[r, j, c] = swiglu(x[r] . gate_e[c], x[r] . up_e[c]), e = ids[r, j] - first, for the
// experts first .. first + count - 1 this buffer holds ([gate_e; up_e] = W[e * 2 inter ..]).
// A pair whose expert is not held is skipped. Grid (ceil_div(inter, MOE_COLS), rows * top_k):
// block y takes the y-th chosen expert (expert_pairs) and every pair that chose it, so an
// expert's rows are read once however many rows chose it (at 16 rows, 128 pairs choose ~82 of
// 128 experts); the blocks past the last chosen expert return at once.
// An expert's pairs a warp carries at once: 3 covers most experts in one pass at 16 and 32 rows
// (~1.6 and ~2.3 pairs a chosen expert), more go in passes that find the rows in L1 or L2. 61
// registers, 4 blocks a SM: at batch 1 (768 blocks) 32 warps x 2 KB of weight chunks in flight
// a SM (unroll 2 x gate, up), against ~35 KB that 4.8 TB/s x ~1 us of latency asks for.
#define MOE_GEMV_GROUP 3
extern "C" __global__ void __launch_bounds__(32 * MOE_COLS, 4)  // <= 64 registers: 4 blocks a SM
moe_gemv_gate_up(const bf16 *__restrict__ x, const int *__restrict__ ids, const bf16 *__restrict__ W,
                 bf16 *__restrict__ act, int rows, int top_k, int inter, int hidden, int first, int count) {
    __shared__ int list[MOE_GEMV_MAX_PAIRS];
    if ((int)blockIdx.y >= count) return;  // past the held experts (at 32 rows, half the grid): no prologue
    int n;
    const int e = expert_pairs(ids, rows * top_k, first, count, list, n);
    const int c = blockIdx.x * MOE_COLS + (threadIdx.x >> 5);
    if (e < 0 || c >= inter) return;
    const bf16 *We = W + (size_t)e * 2 * inter * hidden;
    const bf16 *const ws[2] = {We + (size_t)c * hidden, We + (size_t)(inter + c) * hidden};
    for (int g0 = 0; g0 < n; g0 += MOE_GEMV_GROUP) {
        const bf16 *xs[MOE_GEMV_GROUP];
        bool on[MOE_GEMV_GROUP];
#pragma unroll
        for (int q = 0; q < MOE_GEMV_GROUP; ++q) {
            on[q] = g0 + q < n;
            xs[q] = x + (size_t)(on[q] ? list[g0 + q] / top_k : 0) * hidden;
        }
        float gu[2][MOE_GEMV_GROUP];
        lane_dots_shared<2, MOE_GEMV_GROUP>(ws, xs, on, hidden, gu);
#pragma unroll
        for (int q = 0; q < MOE_GEMV_GROUP; ++q)
            if (on[q]) {  // the same for every lane of the warp
                const float gs = warp_sum(gu[0][q]), us = warp_sum(gu[1][q]);
                if ((threadIdx.x & 31) == 0) act[(size_t)list[g0 + q] * inter + c] = swiglu(gs, us);
            }
    }
}

// sum over j (in order) of weights[r, j] * rbf(act[r, j] . down_e[n]), e = ids[r, j] - first,
// over the choices whose expert is held here (first .. first + count - 1): this warp's output n
// of row r. The choices go in groups of 8, each group's rows walked side by side (lane_dots).
__device__ __forceinline__ float down_sum(const bf16 *__restrict__ act, const int *__restrict__ ids,
                                          const float *__restrict__ weights, const bf16 *__restrict__ W, int r,
                                          int n, int top_k, int hidden, int inter, int first, int count) {
    float acc = 0.f;
    for (int j0 = 0; j0 < top_k; j0 += 8) {
        const bf16 *as[8], *ws[8];
        bool on[8];
#pragma unroll
        for (int jj = 0; jj < 8; ++jj) {
            const int pair = r * top_k + j0 + jj, e = j0 + jj < top_k ? ids[pair] - first : -1;
            on[jj] = e >= 0 && e < count;
            as[jj] = act + (size_t)pair * inter;
            ws[jj] = W + ((size_t)(on[jj] ? e : 0) * hidden + n) * inter;
        }
        float part[8];
        lane_dots<8>(as, ws, on, inter, part);
#pragma unroll
        for (int jj = 0; jj < 8; ++jj) {
            const int pair = r * top_k + j0 + jj;
            const float d = warp_sum(part[jj]);
            if (on[jj]) acc = fmaf(weights[pair], rbf(d), acc);
        }
    }
    return acc;
}

// res[r, n] += down_sum over every choice: the down projections of a row's choices, the
// weighted combine and the residual add. Grid (rows, ceil_div(hidden, MOE_COLS)): blocks start
// in x order, so the blocks in flight together hold every row's same few columns, and the
// rows that chose one expert read its down rows n .. n + 7 at about the same time: one read
// from memory, the others from L2 (at 16 rows 128 pairs choose ~82 experts: ~403 MB of down
// rows a layer are requested, ~258 MB distinct; rows-major order left them ~25 MB apart).
extern "C" __global__ void __launch_bounds__(32 * MOE_COLS)
moe_gemv_down_residual(const bf16 *__restrict__ act, const int *__restrict__ ids,
                       const float *__restrict__ weights, const bf16 *__restrict__ W, bf16 *res, int rows,
                       int top_k, int hidden, int inter) {
    const int r = blockIdx.x, n = blockIdx.y * MOE_COLS + (threadIdx.x >> 5);
    if (r >= rows || n >= hidden) return;
    const float acc = down_sum(act, ids, weights, W, r, n, top_k, hidden, inter, 0, 1 << 30);
    if ((threadIdx.x & 31) == 0) res[(size_t)r * hidden + n] = to_bf(to_f(res[(size_t)r * hidden + n]) + acc);
}

// Expert parallel (one rank of an `ep` split holds experts first .. first + count - 1): down_sum
// over the choices held here (f32), pushed into slot `rank` of every rank's recv buffer
// ([2 halves][ranks][rows][hidden]: recv here, parts[p] on rank p, at `offset`); the dense
// family's all_reduce_add_local then crosses the barrier and adds the ranks' slots, in rank
// order, into the residual (manifests/ep.py). Grid (rows, ceil_div(hidden, MOE_COLS)), as
// moe_gemv_down_residual's.
extern "C" __global__ void __launch_bounds__(32 * MOE_COLS)
moe_gemv_down_push(const bf16 *__restrict__ act, const int *__restrict__ ids, const float *__restrict__ weights,
                   const bf16 *__restrict__ W, float *recv, const unsigned long long *__restrict__ parts, int rows,
                   int top_k, int hidden, int inter, int first, int count, int rank, int ranks, int offset) {
    const int r = blockIdx.x, n = blockIdx.y * MOE_COLS + (threadIdx.x >> 5);
    if (r >= rows || n >= hidden) return;
    const float acc = down_sum(act, ids, weights, W, r, n, top_k, hidden, inter, first, count);
    if ((threadIdx.x & 31) == 0) {
        const size_t at = (size_t)offset + ((size_t)rank * rows + r) * hidden + n;
        for (int p = 0; p < ranks; ++p) (p == rank ? recv : reinterpret_cast<float *>(parts[p]))[at] = acc;
    }
}

// ---- wide decode and prefill: pairs grouped by expert ------------------------------------------
// A stable counting sort of the n_pairs = rows * top_k pairs (pair = r * top_k + j) by expert:
// sorted[s] = the pair at sorted position s (each expert's pairs in pair order), pos[pair] =
// its position; tiles = [n_tiles, then (expert, start, end) a tile], tiles of at most MOE_BM
// positions of one expert. One block of 1024 threads (experts <= 1024: a thread an expert in
// the scan). Integers only, every position decided by the pair order: the same outputs
// whichever thread runs first.
__device__ __forceinline__ void sort_pairs(const int *ids, int *__restrict__ sorted, int *__restrict__ pos,
                                           int *__restrict__ tiles, int n_pairs, int experts) {
    __shared__ int count[MOE_MAX_EXPERTS];
    __shared__ int warp_c[32], warp_t[32];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    for (int e = tid; e < experts; e += blockDim.x) count[e] = 0;
    __syncthreads();
    for (int i = tid; i < n_pairs; i += blockDim.x) atomicAdd(&count[ids[i]], 1);  // integer: exact
    __syncthreads();
    // exclusive scans of the counts (an expert's first position) and of its tiles (its first
    // tile's index): a warp's inclusive scans, then the warps' totals scanned by warp 0
    const int c = tid < experts ? count[tid] : 0, t = (c + MOE_BM - 1) / MOE_BM;
    int ci = c, ti = t;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int oc = __shfl_up_sync(0xffffffffu, ci, o), ot = __shfl_up_sync(0xffffffffu, ti, o);
        if (lane >= o) { ci += oc; ti += ot; }
    }
    if (lane == 31) { warp_c[warp] = ci; warp_t[warp] = ti; }
    __syncthreads();
    if (warp == 0) {
        const int nw = blockDim.x >> 5;
        int wc = lane < nw ? warp_c[lane] : 0, wt = lane < nw ? warp_t[lane] : 0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int oc = __shfl_up_sync(0xffffffffu, wc, o), ot = __shfl_up_sync(0xffffffffu, wt, o);
            if (lane >= o) { wc += oc; wt += ot; }
        }
        if (lane < nw) { warp_c[lane] = wc; warp_t[lane] = wt; }  // inclusive
        if (lane == nw - 1) tiles[0] = wt;
    }
    __syncthreads();
    if (tid < experts) {
        const int at = ci - c + (warp > 0 ? warp_c[warp - 1] : 0), t0 = ti - t + (warp > 0 ? warp_t[warp - 1] : 0);
        count[tid] = at;  // from here: expert tid's next free position
        for (int k = 0; k < t; ++k) {
            tiles[1 + 3 * (t0 + k)] = tid;
            tiles[2 + 3 * (t0 + k)] = at + k * MOE_BM;
            tiles[3 + 3 * (t0 + k)] = min(at + (k + 1) * MOE_BM, at + c);
        }
    }
    __syncthreads();
    // the scatter, blockDim pairs at a time: a pair's place is its expert's next free position
    // plus the pairs of that expert before it in its warp (__match_any_sync); the warps take
    // their turns in pair order, each bumping its experts' positions for the next
    for (int base = 0; base < n_pairs; base += blockDim.x) {
        const int i = base + tid, e = i < n_pairs ? ids[i] : -1;
        const unsigned same = __match_any_sync(0xffffffffu, e);
        const int before = __popc(same & ((1u << lane) - 1u)), first_lane = __ffs(same) - 1;
        const int turns = min((int)blockDim.x, n_pairs - base + 31) >> 5;
        for (int w = 0; w < turns; ++w) {
            if (warp == w && e >= 0) {
                const int at = count[e] + before;
                sorted[at] = i;
                pos[i] = at;
            }
            __syncwarp();  // every lane of a group read count[e] before its first lane bumps it
            if (warp == w && e >= 0 && lane == first_lane) count[e] += __popc(same);
            __syncthreads();
        }
    }
}

extern "C" __global__ void __launch_bounds__(1024)
moe_sort(const int *__restrict__ ids, int *__restrict__ sorted, int *__restrict__ pos, int *__restrict__ tiles,
         int n_pairs, int experts) {
    sort_pairs(ids, sorted, pos, tiles, n_pairs, experts);
}

// The decode programs' routing in one launch: moe_route's rows (warp w routes rows w, w + 32,
// ...: the same function, so the same ids and weights) and moe_sort of their pairs (the same
// outputs), the ids handed over in shared memory. experts <= MOE_FUSED_EXPERTS, rows * top_k
// <= MOE_FUSED_PAIRS (the generator checks both). Launched with programmatic dependent launch:
// it waits for the router's logits, then lets the expert projections launch. Grid 1, block 1024.
#define MOE_FUSED_EXPERTS 256
#define MOE_FUSED_PAIRS 2048
extern "C" __global__ void __launch_bounds__(1024)
moe_route_sort(const float *__restrict__ logits, int *__restrict__ ids, float *__restrict__ weights,
               int *__restrict__ sorted, int *__restrict__ pos, int *__restrict__ tiles, int rows, int experts,
               int top_k, int norm_topk) {
    __shared__ float p[32][MOE_FUSED_EXPERTS];
    __shared__ int sid[MOE_FUSED_PAIRS];
    pdl_wait();
    pdl_launch_dependents();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int r = warp; r < rows; r += blockDim.x >> 5) {
        float w;
        const int id = route_row(logits + (size_t)r * experts, p[warp], experts, top_k, norm_topk, w);
        if (lane < top_k) {
            ids[(size_t)r * top_k + lane] = id;
            weights[(size_t)r * top_k + lane] = w;
            sid[r * top_k + lane] = id;
        }
        __syncwarp();
    }
    __syncthreads();
    sort_pairs(sid, sorted, pos, tiles, rows * top_k, experts);
}

// One MOE_BM x MOE_BN output tile of a grouped GEMM on tensor cores (wmma 16x16x16, fp32
// accumulate): C[i, n] = A[i] . W[n] over K (K % MOE_BK == 0, rows of A and W 16-byte
// aligned), rows i of A given by a_row(i) (nullptr: a zero row), W [N, K]. 4 warps in 2 x 2,
// each 32 x 32 (2 x 2 fragments). NB weight matrices share the A tile (the gate and up halves).
constexpr int LDS = MOE_BK + 8;  // bf16 row pitch in shared memory (a multiple of 8, off the banks)
constexpr int LDC = MOE_BN + 4;
// k-tiles in shared memory: STAGES - 1 of them in flight while one is multiplied. At 64 decode
// rows an expert's tile holds ~4 real rows, so a block is a stream of weight rows whose
// multiply is nothing: with 2 stages each k-tile waited a full memory latency (one 8 KB k-tile
// of gate and up in flight a block); 3 stages keep two in flight. The stages then hold the
// output tile (Cs) after the last k-tile, which keeps a block inside 48 KB of static shared
// memory (gate/up: 46,080 bytes, 4 blocks a SM as before).
#define MOE_STAGES 3
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> Acc;

template <int NB>
struct TileSmem {
    static constexpr int A = MOE_BM * LDS, B = MOE_BN * LDS;  // bf16 elements a stage
    static constexpr int BYTES = MOE_STAGES * (A + NB * B) * 2;
    static_assert(BYTES >= MOE_BM * LDC * 4, "the output tile reuses the stages");
};
template <int NB>
__device__ __forceinline__ unsigned char *tile_smem() {
    __shared__ __align__(128) unsigned char smem[TileSmem<NB>::BYTES];
    return smem;
}

template <int NB, typename ARow>
__device__ __forceinline__ void tile_gemm(ARow a_row, const bf16 *const (&W)[NB], int N, int K, int n0,
                                          Acc (&acc)[NB][2][2]) {
    bf16 *const As = reinterpret_cast<bf16 *>(tile_smem<NB>());   // [STAGES][A]
    bf16 *const Bs = As + MOE_STAGES * TileSmem<NB>::A;             // [STAGES][NB][B]
    const int warp = threadIdx.x >> 5, wm = warp >> 1, wn = warp & 1;
#pragma unroll
    for (int b = 0; b < NB; ++b)
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
            for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[b][i][j], 0.f);
    constexpr int CHUNKS = MOE_BK / 8;  // 16-byte chunks a row of a k-tile
    const int tiles = K / MOE_BK;
    // k-tile kt's copies (cp.async, 16 bytes each, zero-filled past the rows that exist) into
    // stage kt % STAGES, one commit group a k-tile; past the last k-tile an empty group, so
    // that "all but the newest STAGES - 2 groups have landed" always means k-tile kt has
    auto load = [&](int kt) {
        if (kt < tiles) {
            const int stage = kt % MOE_STAGES, k0 = kt * MOE_BK;
            bf16 *as = As + stage * TileSmem<NB>::A;
            for (int c = threadIdx.x; c < MOE_BM * CHUNKS; c += blockDim.x) {
                const int i = c / CHUNKS, q = c % CHUNKS;
                const bf16 *src = a_row(i);
                cp_async16_zfill(&as[i * LDS + q * 8], src ? src + k0 + q * 8 : W[0], src ? 16 : 0);
            }
#pragma unroll
            for (int b = 0; b < NB; ++b) {
                bf16 *bs = Bs + (stage * NB + b) * TileSmem<NB>::B;
                for (int c = threadIdx.x; c < MOE_BN * CHUNKS; c += blockDim.x) {
                    const int n = c / CHUNKS, q = c % CHUNKS;
                    const bool in = n0 + n < N;
                    cp_async16_zfill(&bs[n * LDS + q * 8], in ? W[b] + (size_t)(n0 + n) * K + k0 + q * 8 : W[b],
                                     in ? 16 : 0);
                }
            }
        }
        cp_async_commit();
    };
#pragma unroll
    for (int kt = 0; kt < MOE_STAGES - 1; ++kt) load(kt);
    for (int kt = 0; kt < tiles; ++kt) {
        cp_async_wait<MOE_STAGES - 2>();  // this thread's copies of k-tile kt have landed
        __syncthreads();  // ... and every thread's; and every warp is done with k-tile kt - 1
        load(kt + MOE_STAGES - 1);  // into the stage k-tile kt - 1 used
        const int stage = kt % MOE_STAGES;
        const bf16 *as = As + stage * TileSmem<NB>::A;
#pragma unroll
        for (int kk = 0; kk < MOE_BK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> fa[2];
#pragma unroll
            for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(fa[i], &as[(wm * 32 + i * 16) * LDS + kk], LDS);
#pragma unroll
            for (int b = 0; b < NB; ++b)
#pragma unroll
                for (int j = 0; j < 2; ++j) {
                    // B (k x n) column-major is W's rows as stored: element (k, n) at Bs[n * LDS + k]
                    wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> fb;
                    wmma::load_matrix_sync(fb, &Bs[(stage * NB + b) * TileSmem<NB>::B + (wn * 32 + j * 16) * LDS + kk],
                                           LDS);
#pragma unroll
                    for (int i = 0; i < 2; ++i) wmma::mma_sync(acc[b][i][j], fa[i], fb, acc[b][i][j]);
                }
        }
    }
    cp_async_wait<0>();  // only empty groups are left; none may land in the stages after this
    __syncthreads();     // every warp is done with the stages: the caller's Cs may reuse them
}

// Tile blockIdx.y of `tiles` (moe_sort's): its expert (less `first`) and sorted positions
// [s0, s1); false when there is no such tile or another rank holds its expert.
struct Tile {
    int e, s0, s1;
};
__device__ __forceinline__ bool tile_of_block(const int *__restrict__ tiles, int first, int count, Tile &t) {
    const int i = blockIdx.y;
    if (i >= tiles[0]) return false;
    t = {tiles[1 + 3 * i] - first, tiles[2 + 3 * i], tiles[3 + 3 * i]};
    return t.e >= 0 && t.e < count;
}

// The warp's accumulators into a shared [MOE_BM, LDC] float tile.
__device__ __forceinline__ void store_tile(float *Cs, Acc (&acc)[2][2]) {
    const int warp = threadIdx.x >> 5, wm = warp >> 1, wn = warp & 1;
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j)
            wmma::store_matrix_sync(&Cs[(wm * 32 + i * 16) * LDC + wn * 32 + j * 16], acc[i][j], LDC,
                                    wmma::mem_row_major);
}

// act[s, c] = swiglu(x[row of sorted[s]] . gate_e[c], ... . up_e[c]) for the sorted positions s
// of tile blockIdx.y (expert e - first held here; a tile of another rank's expert is skipped).
// Grid (ceil_div(inter, MOE_BN), max_tiles), block 128.
extern "C" __global__ void __launch_bounds__(128)
moe_group_gate_up(const bf16 *__restrict__ x, const int *__restrict__ sorted, const int *__restrict__ tiles,
                  const bf16 *__restrict__ W, bf16 *__restrict__ act, int top_k, int inter, int hidden, int first,
                  int count) {
    Tile t;
    if (!tile_of_block(tiles, first, count, t)) return;
    const int s0 = t.s0, s1 = t.s1, n0 = blockIdx.x * MOE_BN;
    float *const Cs = reinterpret_cast<float *>(tile_smem<2>());  // [MOE_BM, LDC], after the GEMM
    const bf16 *We = W + (size_t)t.e * 2 * inter * hidden;
    const bf16 *const Ws[2] = {We, We + (size_t)inter * hidden};
    auto a_row = [&](int i) -> const bf16 * {
        return s0 + i < s1 ? x + (size_t)(sorted[s0 + i] / top_k) * hidden : nullptr;
    };
    Acc acc[2][2][2];
    tile_gemm<2>(a_row, Ws, inter, hidden, n0, acc);
    // gate and up fragments share one element layout: SwiGLU element by element
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
            for (int q = 0; q < acc[0][i][j].num_elements; ++q)
                acc[0][i][j].x[q] = to_f(swiglu(acc[0][i][j].x[q], acc[1][i][j].x[q]));
    store_tile(Cs, acc[0]);
    __syncthreads();
    for (int c = threadIdx.x; c < MOE_BM * MOE_BN; c += blockDim.x) {
        const int i = c / MOE_BN, n = c % MOE_BN;
        if (s0 + i < s1 && n0 + n < inter) act[(size_t)(s0 + i) * inter + n0 + n] = to_bf(Cs[i * LDC + n]);
    }
}

// y[s, n] = act[s] . down_e[n] (f32) for the sorted positions of tile blockIdx.y. Grid
// (ceil_div(hidden, MOE_BN), max_tiles), block 128.
extern "C" __global__ void __launch_bounds__(128)
moe_group_down(const bf16 *__restrict__ act, const int *__restrict__ tiles, const bf16 *__restrict__ W,
               float *__restrict__ y, int hidden, int inter, int first, int count) {
    Tile t;
    if (!tile_of_block(tiles, first, count, t)) return;
    const int s0 = t.s0, s1 = t.s1, n0 = blockIdx.x * MOE_BN;
    float *const Cs = reinterpret_cast<float *>(tile_smem<1>());  // [MOE_BM, LDC], after the GEMM
    const bf16 *const Ws[1] = {W + (size_t)t.e * hidden * inter};
    auto a_row = [&](int i) -> const bf16 * { return s0 + i < s1 ? act + (size_t)(s0 + i) * inter : nullptr; };
    Acc acc[1][2][2];
    tile_gemm<1>(a_row, Ws, hidden, inter, n0, acc);
    store_tile(Cs, acc[0]);
    __syncthreads();
    for (int c = threadIdx.x; c < MOE_BM * MOE_BN; c += blockDim.x) {
        const int i = c / MOE_BN, n = c % MOE_BN;
        if (s0 + i < s1 && n0 + n < hidden) y[(size_t)(s0 + i) * hidden + n0 + n] = Cs[i * LDC + n];
    }
}

// out[r, n] = sum over j (in order) of weights[r, j] * rbf(y[pos[r * top_k + j], n]) over the
// choices whose expert is held here (ids[r, j] - first in [0, count)): the weighted combine of
// each row's choices. Grid (rows, ceil_div(hidden, 256)), block 256.
__device__ __forceinline__ void combine(const float *__restrict__ y, const int *__restrict__ pos,
                                        const int *__restrict__ ids, const float *__restrict__ weights,
                                        bf16 *__restrict__ out, int rows, int top_k, int hidden, int first,
                                        int count) {
    const int r = blockIdx.x, n = blockIdx.y * blockDim.x + threadIdx.x;
    if (r >= rows || n >= hidden) return;
    float acc = 0.f;
    for (int j = 0; j < top_k; ++j) {
        const int pair = r * top_k + j;
        if (ids && (ids[pair] - first < 0 || ids[pair] - first >= count)) continue;
        acc = fmaf(weights[pair], rbf(y[(size_t)pos[pair] * hidden + n]), acc);
    }
    out[(size_t)r * hidden + n] = to_bf(acc);
}

// Every choice (one device).
extern "C" __global__ void __launch_bounds__(256)
moe_combine(const float *__restrict__ y, const int *__restrict__ pos, const float *__restrict__ weights,
            bf16 *__restrict__ out, int rows, int top_k, int hidden) {
    combine(y, pos, nullptr, weights, out, rows, top_k, hidden, 0, 0);
}

// The choices this rank holds (expert parallel: the other ranks' parts are summed in by an
// all-reduce after it).
extern "C" __global__ void __launch_bounds__(256)
moe_combine_part(const float *__restrict__ y, const int *__restrict__ pos, const int *__restrict__ ids,
                 const float *__restrict__ weights, bf16 *__restrict__ out, int rows, int top_k, int hidden,
                 int first, int count) {
    combine(y, pos, ids, weights, out, rows, top_k, hidden, first, count);
}
