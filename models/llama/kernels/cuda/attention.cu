// Decode attention over the paged KV state (GQA, causal, fp32 softmax, scale 1/sqrt(head_dim)).
//
// One block per (query row r, kv head h, head group hg, context split z), one query row per
// sequence (rows = sequences): the G = n_q_heads / n_kv_heads query heads that share kv head h
// (query head h*G + g, as transformers' repeat_kv) are served by HG = gridDim.y / n_kv_heads
// blocks of G / HG heads each (block hg: heads h*G + hg*G/HG + g), over context positions
// [z*split_tokens, min(pos[r]+1, (z+1)*split_tokens)) of sequence r. Every head's arithmetic
// is the same whatever HG (its scores, its warp's softmax, its P.V slices, the merge): HG
// shortens a block's serial chain at large G and does not change a bit.
// Only the n_used = ceil((pos[r] + 1) / split_tokens) splits that hold context work: with one
// the block writes o directly; with more, each writes its partial and the last block to arrive
// (counter sem[r, h*HG + hg], i32, zero between launches, reset by that block) merges them in order
// z = 0, 1, ...: one launch, the same bits whichever block arrives last.
// Layout: q [rows, q_stride] (query head hq at column hq*head_dim), o [rows,
// n_q_heads*head_dim], both bf16. head_dim in {64, 128, 256}; G <= 8.
// Grid (rows, n_kv_heads * HG, n_splits), block DEC_THREADS (128, from table.py).
#include "common.cuh"

#if !defined(DEC_THREADS)
#error "DEC_THREADS comes from the family's TILES (kern_models.common.cubins passes it as -D)"
#endif

#define ATTN_WARPS 4
#define ATTN_MAX_G 8
static_assert(DEC_THREADS == 32 * ATTN_WARPS && DEC_THREADS == 128, "the decode tiles are laid out for 4 warps");

// ---- decode: tiled over tokens --------------------------------------------------------
// The block (r, h, z) takes its split's tokens in tiles of DEC_TT = 8192 / head_dim tokens
// (128, 64, 32): a split of up to DEC_TT tokens is one pass. Per tile: the K and V rows of the
// tile are loaded (8 independent 16-byte copies per thread, K and V each) into shared memory;
// scores S[g][t] are computed token-parallel (thread = one token and a subset of the G query
// heads, all of head_dim in a thread: no shuffles); one warp per head takes the tile's max,
// exponentiates and sums (fixed order); then P.V with a thread per (token slice, dim pair) and
// all G heads in the thread: 256 / head_dim slices, 32 tokens each at most, added in slice
// order at the end. All threads share one running max per head.
#define DEC_TILE_ELEMS 8192                       // DEC_TT * head_dim
#define DEC_K_BYTES (128 * (64 + 8) * 2)          // largest padded K tile (head_dim 64)
#define DEC_V_BYTES (DEC_TILE_ELEMS * 2)
#define DEC_Q_FLOATS (ATTN_MAX_G * 256)
#define DEC_P_FLOATS (ATTN_MAX_G * 128)

struct DecSmem {
    alignas(16) unsigned char kv[DEC_K_BYTES + DEC_V_BYTES];  // K tile, V tile; later the merge
    alignas(16) float q[DEC_Q_FLOATS];                          // q * scale * log2(e)
    float p[DEC_P_FLOATS];                                       // scores, then probabilities
    float m[ATTN_MAX_G], l[ATTN_MAX_G], corr[ATTN_MAX_G];
    int merge;                                                   // this block merges the splits
};
static_assert(sizeof(DecSmem) <= 48 * 1024, "attention_decode's shared memory is static: 48 KB at most");

// (head, dim) outputs a thread: i = tid + 128 j, j < DEC_PER_THREAD(HD)
#define DEC_PER_THREAD(HD) (ATTN_MAX_G * (HD) / 128)

// Folds split z's partial (its running max m in log2 units, its sum l, its unnormalised output
// a) into the merged (M, L, A) of splits 0 .. z-1. Every row's output is the fold of its splits
// in order z = 0, 1, ... from (-inf, 0, 0), then A / L: the decode merge (splits in other
// blocks), a decode row with one split and attention_rows (splits in turn in one block) run
// this same arithmetic, so a token's attention has the same bits in prefill and in decode.
// Explicit roundings: no contraction may differ between the kernels that inline it.
__device__ __forceinline__ void fold_split(float &M, float &L, float &A, float m, float l, float a) {
    const float Mn = fmaxf(M, m);
    const float co = exp2f(__fsub_rn(M, Mn)), cz = exp2f(__fsub_rn(m, Mn));
    L = __fadd_rn(__fmul_rn(L, co), __fmul_rn(l, cz));
    A = __fadd_rn(__fmul_rn(A, co), __fmul_rn(a, cz));
    M = Mn;
}

// This block's query heads: gridDim.y = n_kv_heads * HG blocks share the kv heads, HG a kv head,
// each serving G of its heads from hq0 on (G = n_q_heads / n_kv_heads / HG), as the header says.
struct HeadGroup {
    int h, G, hq0;  // kv head, query heads, the first of them
};
__device__ __forceinline__ HeadGroup head_group(int n_q_heads, int n_kv_heads) {
    const int HG = gridDim.y / n_kv_heads, G = n_q_heads / n_kv_heads / HG, h = blockIdx.y / HG;
    return {h, G, h * (G * HG) + (int)blockIdx.y % HG * G};
}

// Whether the launch's grid suits the heads: a whole group of at most ATTN_MAX_G query heads a
// kv head, gridDim.y a multiple of n_kv_heads that divides each group evenly.
__device__ __forceinline__ bool head_groups_fit(int n_q_heads, int n_kv_heads) {
    const int G = n_q_heads / n_kv_heads, HG = gridDim.y / n_kv_heads;
    return G <= ATTN_MAX_G && HG >= 1 && gridDim.y % n_kv_heads == 0 && G % HG == 0;
}

// One split of row r's context, positions [t0, t1), for the block's query heads (of kv head
// heads.h): leaves each thread's unnormalised outputs in A[j] ((head, dim) i = tid + 128 j,
// i < G * head_dim) and the split's running max and sum in sm.m, sm.l. page0: the first tile's
// page numbers, read by the caller (decode reads them before its PDL wait); pdl: wait for the
// previous kernel before the row at p_last and q are read.
template <int HD>
__device__ void attend_split(const bf16 *__restrict__ q, const char *__restrict__ kv_state,
                             const int *__restrict__ pt_row, const int (&page0)[DEC_TILE_ELEMS / HD * (HD / 8) / 128],
                             int r, HeadGroup heads, int p_last, int t0, int t1, int layer, int n_layers,
                             int n_kv_heads, int page_tokens, int q_stride, bool pdl,
                             float (&A)[DEC_PER_THREAD(HD)], DecSmem &sm) {
    constexpr int TT = DEC_TILE_ELEMS / HD;   // tokens per tile
    constexpr int KP = HD + 8;                // padded K row (bf16): conflict-free 16-byte reads
    constexpr int CH = HD / 8;                // 16-byte chunks per row
    constexpr int NSETS = 128 / TT;           // QK: head subsets
    constexpr int LOADS = TT * CH / 128;      // 16-byte loads per thread per tile, K and V each
    constexpr int DP = HD / 2;                // P.V: dim pairs, one a thread
    constexpr int TS = 128 / DP;              // P.V: token slices
    const int h = heads.h, G = heads.G;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    bf16 *sK = reinterpret_cast<bf16 *>(sm.kv);
    bf16 *sV = reinterpret_cast<bf16 *>(sm.kv + DEC_K_BYTES);
    const size_t v_shift = (size_t)n_kv_heads * page_tokens * HD * 2;  // kv = 1

    // P.V roles: dims 2 dp, 2 dp + 1 of every head, tokens slice, slice + TS, ...
    const int dp = tid % DP, slice = tid / DP;
    float acc[ATTN_MAX_G][2];
#pragma unroll
    for (int g = 0; g < ATTN_MAX_G; ++g) acc[g][0] = acc[g][1] = 0.f;

    // Copy a tile's K and V rows into shared memory (cp.async, at L2): which = 0 all rows but
    // the one at p_last, 1 only that one (the previous kernel writes it), 2 all.
    auto load_tile = [&](int tb, int nt, int which) {
#pragma unroll
        for (int i = 0; i < LOADS; ++i) {
            const int c = tid + i * 128, tt = c / CH, ch = c % CH;
            const int t = tb + tt;
            if (tt < nt && (which == 2 || (t == p_last) == (which == 1))) {
                const int page = tb == t0 ? page0[i] : pt_row[t / page_tokens];
                const size_t off = kv_offset(page, layer, 0, h, t % page_tokens,
                                             n_layers, n_kv_heads, HD, page_tokens) + ch * 16;
                cp_async16(sK + tt * KP + ch * 8, kv_state + off);
                cp_async16(sV + tt * HD + ch * 8, kv_state + off + v_shift);
            }
        }
        cp_async_commit();
    };
    load_tile(t0, min(TT, t1 - t0), 0);
    if (pdl) pdl_wait();
    load_tile(t0, min(TT, t1 - t0), 1);

    for (int tb = t0; tb < t1; tb += TT) {
        const int nt = min(TT, t1 - tb);
        if (tb != t0) load_tile(tb, nt, 2);
        if (tb == t0) {
            const float qscale = (1.f / sqrtf((float)HD)) * LOG2E;
            const bf16 *qh = q + (size_t)r * q_stride + (size_t)heads.hq0 * HD;
            for (int i = tid; i < G * HD; i += 128) sm.q[i] = to_f(__ldcg(qh + i)) * qscale;
            if (tid < ATTN_MAX_G) { sm.m[tid] = -INFINITY; sm.l[tid] = 0.f; }
        }
        cp_async_wait<0>();
        __syncthreads();

        // Scores (log2 units): thread = token tt, heads gs, gs + NSETS, ...
        {
            const int tt = tid % TT, gs = tid / TT;
            for (int g = gs; g < G; g += NSETS) {
                float d = -INFINITY;
                if (tt < nt) {
                    d = 0.f;
                    const float *qg = sm.q + g * HD;
#pragma unroll 4
                    for (int ch = 0; ch < CH; ++ch) {
                        float kf[8];
                        unpack8(*reinterpret_cast<const uint4 *>(sK + tt * KP + ch * 8), kf);
                        const float4 qa = *reinterpret_cast<const float4 *>(qg + ch * 8);
                        const float4 qb = *reinterpret_cast<const float4 *>(qg + ch * 8 + 4);
                        d += qa.x * kf[0] + qa.y * kf[1] + qa.z * kf[2] + qa.w * kf[3] +
                             qb.x * kf[4] + qb.y * kf[5] + qb.z * kf[6] + qb.w * kf[7];
                    }
                }
                sm.p[g * TT + tt] = d;
            }
        }
        __syncthreads();

        // Softmax over the tile: one warp per head.
        for (int g = warp; g < G; g += ATTN_WARPS) {
            float mx = -INFINITY;
            for (int i = lane; i < TT; i += 32) mx = fmaxf(mx, sm.p[g * TT + i]);
            mx = warp_max(mx);
            const float m_old = sm.m[g], m_new = fmaxf(m_old, mx);
            float sum = 0.f;
            for (int i = lane; i < TT; i += 32) {
                const float pr = exp2f(sm.p[g * TT + i] - m_new);
                sm.p[g * TT + i] = pr;
                sum += pr;
            }
            sum = warp_sum(sum);
            if (lane == 0) {
                const float corr = exp2f(m_old - m_new);
                sm.corr[g] = corr;
                sm.l[g] = sm.l[g] * corr + sum;
                sm.m[g] = m_new;
            }
        }
        __syncthreads();

        // P.V: this thread's dim pair of every head over its token slice (probabilities are
        // read as warp-wide broadcasts: a warp's threads share the slice).
#pragma unroll
        for (int g = 0; g < ATTN_MAX_G; ++g) {
            if (g >= G) break;
            const float corr = sm.corr[g];
            acc[g][0] *= corr;
            acc[g][1] *= corr;
        }
#pragma unroll 4
        for (int tt = slice; tt < nt; tt += TS) {
            const __nv_bfloat162 v2 = *reinterpret_cast<const __nv_bfloat162 *>(sV + tt * HD + 2 * dp);
            const float v0 = __low2float(v2), v1 = __high2float(v2);
#pragma unroll
            for (int g = 0; g < ATTN_MAX_G; ++g) {
                if (g >= G) break;
                const float pr = sm.p[g * TT + tt];
                acc[g][0] += pr * v0;
                acc[g][1] += pr * v1;
            }
        }
        __syncthreads();  // the next tile overwrites K, V and p
    }

    // Merge the token slices in order: s_acc[slice][g][HD] (8 KB for every head_dim).
    float *s_acc = reinterpret_cast<float *>(sm.kv);
#pragma unroll
    for (int g = 0; g < ATTN_MAX_G; ++g) {
        if (g >= G) break;
        *reinterpret_cast<float2 *>(s_acc + (slice * ATTN_MAX_G + g) * HD + 2 * dp) = make_float2(acc[g][0], acc[g][1]);
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < DEC_PER_THREAD(HD); ++j) {
        const int i = tid + 128 * j;
        if (i >= G * HD) break;
        const int g = i / HD, d = i % HD;
        float a = 0.f;
#pragma unroll
        for (int sl = 0; sl < TS; ++sl) a += s_acc[(sl * ATTN_MAX_G + g) * HD + d];
        A[j] = a;
    }
}

// The first tile's page numbers of split [t0, ...) of the row whose page-table row is pt_row.
template <int HD>
__device__ __forceinline__ void first_pages(int (&page0)[DEC_TILE_ELEMS / HD * (HD / 8) / 128],
                                            const int *__restrict__ pt_row, int t0, int pages_per_seq,
                                            int page_tokens) {
    constexpr int CH = HD / 8, LOADS = DEC_TILE_ELEMS / HD * CH / 128;
#pragma unroll
    for (int i = 0; i < LOADS; ++i) {
        const int t = t0 + (threadIdx.x + i * 128) / CH;
        page0[i] = t < pages_per_seq * page_tokens ? pt_row[t / page_tokens] : 0;
    }
}

template <int HD>
__device__ void attend_decode(const bf16 *__restrict__ q, const char *__restrict__ kv_state,
                              const int *__restrict__ page_table, int r,
                              const int *__restrict__ pos, float *__restrict__ part_o, float *__restrict__ part_ml,
                              int *__restrict__ sem, bf16 *__restrict__ o, int pages_per_seq, int layer, int n_layers,
                              int n_q_heads, int n_kv_heads, int page_tokens, int split_tokens,
                              int q_stride, DecSmem &sm) {
    const int z = blockIdx.z, n_splits = gridDim.z, tid = threadIdx.x;
    const HeadGroup heads = head_group(n_q_heads, n_kv_heads);
    const int G = heads.G;
    const int t0 = z * split_tokens;
    const int *pt_row = page_table + (size_t)r * pages_per_seq;
    // Under PDL this runs before griddepcontrol.wait: pos and the page table are inputs of the
    // step, and the K/V rows of positions before pos[r] were written by earlier steps. The first
    // tile's page numbers are read together with pos (one round trip, not two); the table row
    // has pages_per_seq entries, so indexes past it are not read.
    int page0[DEC_TILE_ELEMS / HD * (HD / 8) / 128];
    first_pages<HD>(page0, pt_row, t0, pages_per_seq, page_tokens);
    const int p_last = pos[r];
    // Splits that hold context: the others leave at once and take no part in the merge.
    const int n_used = min(n_splits, (p_last + split_tokens) / split_tokens);
    if (z >= n_used) return;
    const int t1 = min(p_last + 1, t0 + split_tokens);
    float A[DEC_PER_THREAD(HD)];
    attend_split<HD>(q, kv_state, pt_row, page0, r, heads, p_last, t0, t1, layer, n_layers, n_kv_heads, page_tokens,
                     q_stride, true, A, sm);
#pragma unroll
    for (int j = 0; j < DEC_PER_THREAD(HD); ++j) {
        const int i = tid + 128 * j;
        if (i >= G * HD) break;
        const int g = i / HD, d = i % HD, hq = heads.hq0 + g;
        if (n_used == 1) {
            float M = -INFINITY, L = 0.f, a = 0.f;
            fold_split(M, L, a, sm.m[g], sm.l[g], A[j]);
            o[(size_t)r * n_q_heads * HD + (size_t)hq * HD + d] = to_bf(a / L);
        } else {
            const size_t slot = ((size_t)r * n_q_heads + hq) * n_splits + z;
            part_o[slot * HD + d] = A[j];
            if (d == 0) { part_ml[slot * 2] = sm.m[g]; part_ml[slot * 2 + 1] = sm.l[g]; }
        }
    }
    if (n_used == 1) return;

    // The last of the n_used blocks of (r, h, hg) to finish merges them: fold_split over z = 0,
    // 1, ... in order (the same bits whichever block is last). sem[r, h*HG + hg] counts arrivals
    // and is reset by the merging block.
    __threadfence();
    __syncthreads();
    if (tid == 0) {
        int *cnt = sem + (size_t)r * gridDim.y + blockIdx.y;
        const bool last = atomicAdd(cnt, 1) == n_used - 1;
        if (last) atomicExch(cnt, 0);
        sm.merge = last;
    }
    __syncthreads();
    if (!sm.merge) return;
    __threadfence();
    for (int i = tid; i < G * HD; i += 128) {
        const int g = i / HD, d = i % HD, hq = heads.hq0 + g;
        const size_t base = ((size_t)r * n_q_heads + hq) * n_splits;
        float M = -INFINITY, L = 0.f, a = 0.f;
        for (int zz = 0; zz < n_used; ++zz)
            fold_split(M, L, a, __ldcg(part_ml + (base + zz) * 2), __ldcg(part_ml + (base + zz) * 2 + 1),
                       __ldcg(part_o + (base + zz) * HD + d));
        o[(size_t)r * n_q_heads * HD + (size_t)hq * HD + d] = to_bf(a / L);
    }
}

// attention_rows: a prompt row's attention in decode's order. Row r of sequence s (cu_seqlens)
// attends to positions 0 .. pos[r] of s, split by split_tokens as attention_decode splits a
// decode row's context; this block (r, h, hg) takes the splits in turn, each exactly as decode's
// block z computes it, and folds them in order as decode's merge does: the same bits as the
// token decoded. Every row re-reads its own context (no K/V tile is shared among the rows of a
// prompt), the price of that order: docs/determinism.md.
template <int HD>
__device__ void attend_rows(const bf16 *__restrict__ q, const char *__restrict__ kv_state,
                            const int *__restrict__ page_table, const int *__restrict__ cu_seqlens,
                            const int *__restrict__ pos, bf16 *__restrict__ o, int r, int n_seqs,
                            int pages_per_seq, int layer, int n_layers, int n_q_heads, int n_kv_heads,
                            int page_tokens, int split_tokens, int q_stride, DecSmem &sm) {
    const HeadGroup heads = head_group(n_q_heads, n_kv_heads);
    const int G = heads.G, tid = threadIdx.x;
    const int *pt_row = page_table + (size_t)seq_of_row(cu_seqlens, n_seqs, r) * pages_per_seq;
    const int p_last = pos[r];
    const int n_used = (p_last + split_tokens) / split_tokens;
    float M[DEC_PER_THREAD(HD)], L[DEC_PER_THREAD(HD)], Acc[DEC_PER_THREAD(HD)], A[DEC_PER_THREAD(HD)];
#pragma unroll
    for (int j = 0; j < DEC_PER_THREAD(HD); ++j) M[j] = -INFINITY, L[j] = Acc[j] = 0.f;
    for (int z = 0; z < n_used; ++z) {
        const int t0 = z * split_tokens, t1 = min(p_last + 1, t0 + split_tokens);
        int page0[DEC_TILE_ELEMS / HD * (HD / 8) / 128];
        first_pages<HD>(page0, pt_row, t0, pages_per_seq, page_tokens);
        attend_split<HD>(q, kv_state, pt_row, page0, r, heads, p_last, t0, t1, layer, n_layers, n_kv_heads,
                         page_tokens, q_stride, false, A, sm);
#pragma unroll
        for (int j = 0; j < DEC_PER_THREAD(HD); ++j) {
            const int i = tid + 128 * j;
            if (i >= G * HD) break;
            const int g = i / HD;
            fold_split(M[j], L[j], Acc[j], sm.m[g], sm.l[g], A[j]);
        }
        __syncthreads();  // the next split resets sm.m and sm.l
    }
#pragma unroll
    for (int j = 0; j < DEC_PER_THREAD(HD); ++j) {
        const int i = tid + 128 * j;
        if (i >= G * HD) break;
        const int g = i / HD, d = i % HD;
        o[(size_t)r * n_q_heads * HD + (size_t)(heads.hq0 + g) * HD + d] = to_bf(Acc[j] / L[j]);
    }
}

extern "C" __global__ void __launch_bounds__(DEC_THREADS, 4)
attention_decode(const bf16 *__restrict__ q, const char *__restrict__ kv_state,
                 const int *__restrict__ page_table, const int *__restrict__ pos,
                 float *__restrict__ part_o, float *__restrict__ part_ml, int *__restrict__ sem,
                 bf16 *__restrict__ o, int rows, int pages_per_seq, int layer, int n_layers,
                 int n_q_heads, int n_kv_heads, int head_dim, int page_tokens, int split_tokens,
                 int q_stride) {
    __shared__ DecSmem sm;
    // The next kernel (the o projection) may launch at once: before its own wait it only streams
    // its weights, so it can overlap this kernel and the qkv projection that this one waits on.
    // This kernel waits (in attend_decode, once its first tile's older K/V rows are on their way)
    // before it reads q or writes anything, so the chain's order holds: the o projection's wait
    // returns after this kernel, which finished after the qkv projection.
    pdl_launch_dependents();
    const int r = blockIdx.x;
    if (r >= rows || !head_groups_fit(n_q_heads, n_kv_heads)) return;
#define DEC_ARGS q, kv_state, page_table, r, pos, part_o, part_ml, sem, o, pages_per_seq, layer, \
                 n_layers, n_q_heads, n_kv_heads, page_tokens, split_tokens, q_stride, sm
    switch (head_dim) {
        case 64: attend_decode<64>(DEC_ARGS); break;
        case 128: attend_decode<128>(DEC_ARGS); break;
        case 256: attend_decode<256>(DEC_ARGS); break;
        default: break;
    }
#undef DEC_ARGS
}

extern "C" __global__ void __launch_bounds__(DEC_THREADS, 4)
attention_rows(const bf16 *__restrict__ q, const char *__restrict__ kv_state, const int *__restrict__ page_table,
               const int *__restrict__ cu_seqlens, const int *__restrict__ pos, bf16 *__restrict__ o, int rows,
               int n_seqs, int pages_per_seq, int layer, int n_layers, int n_q_heads, int n_kv_heads, int head_dim,
               int page_tokens, int split_tokens, int q_stride) {
    __shared__ DecSmem sm;
    const int r = blockIdx.x;
    if (r >= rows || !head_groups_fit(n_q_heads, n_kv_heads)) return;
#define ROW_ARGS q, kv_state, page_table, cu_seqlens, pos, o, r, n_seqs, pages_per_seq, layer, n_layers, \
                 n_q_heads, n_kv_heads, page_tokens, split_tokens, q_stride, sm
    switch (head_dim) {
        case 64: attend_rows<64>(ROW_ARGS); break;
        case 128: attend_rows<128>(ROW_ARGS); break;
        case 256: attend_rows<256>(ROW_ARGS); break;
        default: break;
    }
#undef ROW_ARGS
}
