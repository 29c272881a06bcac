// Attention over the paged KV state (GQA, causal, fp32 softmax, scale 1/sqrt(head_dim)).
//
// One block per (query row r, kv head h, context split z): it serves the G = n_q_heads /
// n_kv_heads query heads that share kv head h (query head h*G + g, as transformers'
// repeat_kv), over context positions [z*split_tokens, min(pos[r]+1, (z+1)*split_tokens)).
// Row r attends to positions 0..pos[r] of its sequence s:
//   attention_decode:  one row per sequence, s = r (rows = sequences).
//   attention_prefill: rows packed by cu_seqlens, s = the sequence that owns r.
// Each of the 4 warps takes every 4th token of the split; lanes split head_dim; scores are
// reduced by a fixed xor tree, warps are merged in index order: deterministic.
// attention_prefill (row-parallel, kept as a cross-check of prefill_attention.cu): with
// gridDim.z == 1 the block writes o directly; else unnormalized partials (part_o[r, hq, z, :],
// part_ml[r, hq, z, {max, sum}], log2 domain) that attention_combine merges in order z.
// attention_decode uses only the n_used = ceil((pos[r] + 1) / split_tokens) splits that hold
// context: with one it writes o directly; with more, each writes its partial and the last
// block to arrive (counter sem[r, h], i32, zero between launches, reset by that block) merges
// them in order z = 0, 1, ...: one launch, the same bits whichever block arrives last.
// Layout: q [rows, q_stride] (query head hq at column hq*head_dim), o [rows,
// n_q_heads*head_dim], both bf16. head_dim in {64, 128, 256}; G <= 8.
// Grid (rows, n_kv_heads, n_splits), block 128. Combine: grid (rows, n_q_heads), block
// head_dim.
#include "common.cuh"

#define ATTN_WARPS 4
#define ATTN_MAX_G 8

template <int E> struct Lane;  // E bf16 per lane, loaded as one word
template <> struct Lane<2> {
    __device__ static void load(const bf16 *p, float *f) {
        const __nv_bfloat162 v = *reinterpret_cast<const __nv_bfloat162 *>(p);
        f[0] = __low2float(v); f[1] = __high2float(v);
    }
};
template <> struct Lane<4> {
    __device__ static void load(const bf16 *p, float *f) {
        const uint2 u = *reinterpret_cast<const uint2 *>(p);
        const bf16 *h = reinterpret_cast<const bf16 *>(&u);
        for (int i = 0; i < 4; ++i) f[i] = to_f(h[i]);
    }
};
template <> struct Lane<8> {
    __device__ static void load(const bf16 *p, float *f) { unpack8(*reinterpret_cast<const uint4 *>(p), f); }
};

template <int HD>
__device__ void attend(const bf16 *__restrict__ q, const char *__restrict__ kv_state,
                       const int *__restrict__ page_table, int s, int p_last, float *part_o,
                       float *part_ml, bf16 *o, int r, int pages_per_seq, int layer, int n_layers,
                       int n_q_heads, int n_kv_heads, int page_tokens, int split_tokens,
                       int q_stride, float *smem) {
    constexpr int E = HD / 32;
    const int h = blockIdx.y, z = blockIdx.z, n_splits = gridDim.z;
    const int G = n_q_heads / n_kv_heads;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float qscale = (1.f / sqrtf((float)HD)) * 1.4426950408889634f;  // 1/sqrt(d) * log2(e)

    float qr[ATTN_MAX_G][E], acc[ATTN_MAX_G][E], m[ATTN_MAX_G], l[ATTN_MAX_G];
#pragma unroll
    for (int g = 0; g < ATTN_MAX_G; ++g) {
        m[g] = -INFINITY;
        l[g] = 0.f;
#pragma unroll
        for (int e = 0; e < E; ++e) { acc[g][e] = 0.f; qr[g][e] = 0.f; }
        if (g < G) {
            Lane<E>::load(q + (size_t)r * q_stride + (size_t)(h * G + g) * HD + lane * E, qr[g]);
#pragma unroll
            for (int e = 0; e < E; ++e) qr[g][e] *= qscale;
        }
    }

    // Each warp takes tokens t0 + warp, t0 + warp + 4, ... in order; U of them are loaded
    // before any is used, so U page-table and K/V loads are in flight at once.
    constexpr int U = E <= 4 ? 4 : 2;
    const int t0 = z * split_tokens;
    const int t1 = min(p_last + 1, t0 + split_tokens);
    const size_t v_shift = (size_t)n_kv_heads * page_tokens * HD * 2;  // kv = 1
    for (int tb = t0 + warp; tb < t1; tb += ATTN_WARPS * U) {
        float kf[U][E], vf[U][E];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int t = tb + u * ATTN_WARPS;
            if (t < t1) {
                const int phys = page_table[(size_t)s * pages_per_seq + t / page_tokens];
                const size_t off = kv_offset(phys, layer, 0, h, t % page_tokens, n_layers,
                                             n_kv_heads, HD, page_tokens);
                Lane<E>::load(reinterpret_cast<const bf16 *>(kv_state + off) + lane * E, kf[u]);
                Lane<E>::load(reinterpret_cast<const bf16 *>(kv_state + off + v_shift) + lane * E, vf[u]);
            }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            if (tb + u * ATTN_WARPS >= t1) break;
#pragma unroll
            for (int g = 0; g < ATTN_MAX_G; ++g) {
                if (g >= G) break;
                float d = 0.f;
#pragma unroll
                for (int e = 0; e < E; ++e) d += qr[g][e] * kf[u][e];
                const float sc = warp_sum(d);
                const float mn = fmaxf(m[g], sc);
                const float corr = exp2f(m[g] - mn), pr = exp2f(sc - mn);
                l[g] = l[g] * corr + pr;
#pragma unroll
                for (int e = 0; e < E; ++e) acc[g][e] = acc[g][e] * corr + pr * vf[u][e];
                m[g] = mn;
            }
        }
    }

    // Merge the warps in order: smem = acc[warp][g][HD], then m[warp][g], l[warp][g].
    float *s_acc = smem, *s_m = smem + ATTN_WARPS * ATTN_MAX_G * HD, *s_l = s_m + ATTN_WARPS * ATTN_MAX_G;
#pragma unroll
    for (int g = 0; g < ATTN_MAX_G; ++g) {
        if (g >= G) break;
#pragma unroll
        for (int e = 0; e < E; ++e) s_acc[(warp * ATTN_MAX_G + g) * HD + lane * E + e] = acc[g][e];
        if (lane == 0) { s_m[warp * ATTN_MAX_G + g] = m[g]; s_l[warp * ATTN_MAX_G + g] = l[g]; }
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < G * HD; idx += blockDim.x) {
        const int g = idx / HD, d = idx % HD;
        float M = -INFINITY;
        for (int w = 0; w < ATTN_WARPS; ++w) M = fmaxf(M, s_m[w * ATTN_MAX_G + g]);
        float L = 0.f, A = 0.f;
        if (M != -INFINITY) {
            for (int w = 0; w < ATTN_WARPS; ++w) {
                const float sw = exp2f(s_m[w * ATTN_MAX_G + g] - M);
                L += s_l[w * ATTN_MAX_G + g] * sw;
                A += s_acc[(w * ATTN_MAX_G + g) * HD + d] * sw;
            }
        }
        const int hq = h * G + g;
        if (n_splits == 1) {
            o[(size_t)r * n_q_heads * HD + (size_t)hq * HD + d] = to_bf(A / L);
        } else {
            const size_t slot = ((size_t)r * n_q_heads + hq) * n_splits + z;
            part_o[slot * HD + d] = A;
            if (d == 0) { part_ml[slot * 2] = M; part_ml[slot * 2 + 1] = L; }
        }
    }
}

#define ATTN_SMEM (ATTN_WARPS * ATTN_MAX_G * 256 + 2 * ATTN_WARPS * ATTN_MAX_G)

#define ATTN_DISPATCH(...)                                                              \
    switch (head_dim) {                                                                 \
        case 64: attend<64>(__VA_ARGS__); break;                                        \
        case 128: attend<128>(__VA_ARGS__); break;                                      \
        case 256: attend<256>(__VA_ARGS__); break;                                      \
        default: break;                                                                 \
    }

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

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }

struct DecSmem {
    alignas(16) unsigned char kv[DEC_K_BYTES + DEC_V_BYTES];  // K tile, V tile; later the merge
    alignas(16) float q[DEC_Q_FLOATS];                          // q * scale * log2(e)
    float p[DEC_P_FLOATS];                                       // scores, then probabilities
    float m[ATTN_MAX_G], l[ATTN_MAX_G], corr[ATTN_MAX_G];
    int merge;                                                   // this block merges the splits
};
static_assert(sizeof(DecSmem) <= 48 * 1024, "attention_decode's shared memory is static: 48 KB at most");

template <int HD>
__device__ void attend_decode(const bf16 *__restrict__ q, const char *__restrict__ kv_state,
                              const int *__restrict__ page_table, int r,
                              const int *__restrict__ pos, float *__restrict__ part_o, float *__restrict__ part_ml,
                              int *__restrict__ sem, bf16 *__restrict__ o, int pages_per_seq, int layer, int n_layers,
                              int n_q_heads, int n_kv_heads, int page_tokens, int split_tokens,
                              int q_stride, DecSmem &sm) {
    constexpr int TT = DEC_TILE_ELEMS / HD;   // tokens per tile
    constexpr int KP = HD + 8;                // padded K row (bf16): conflict-free 16-byte reads
    constexpr int CH = HD / 8;                // 16-byte chunks per row
    constexpr int NSETS = 128 / TT;           // QK: head subsets
    constexpr int LOADS = TT * CH / 128;      // 16-byte loads per thread per tile, K and V each
    constexpr int DP = HD / 2;                // P.V: dim pairs, one a thread
    constexpr int TS = 128 / DP;              // P.V: token slices
    const int h = blockIdx.y, z = blockIdx.z, n_splits = gridDim.z;
    const int G = n_q_heads / n_kv_heads;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int t0 = z * split_tokens;
    const int *pt_row = page_table + (size_t)r * pages_per_seq;
    // Under PDL this runs before griddepcontrol.wait: pos and the page table are inputs of the
    // step, and the K/V rows of positions before pos[r] were written by earlier steps. The first
    // tile's page numbers are read together with pos (one round trip, not two); the table row
    // has pages_per_seq entries, so indexes past it are not read.
    int page0[LOADS];
#pragma unroll
    for (int i = 0; i < LOADS; ++i) {
        const int t = t0 + (tid + i * 128) / CH;
        page0[i] = t < pages_per_seq * page_tokens ? pt_row[t / page_tokens] : 0;
    }
    const int p_last = pos[r];
    // Splits that hold context: the others leave at once and take no part in the merge.
    const int n_used = min(n_splits, (p_last + split_tokens) / split_tokens);
    if (z >= n_used) return;
    const int t1 = min(p_last + 1, t0 + split_tokens);
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
    pdl_wait();
    load_tile(t0, min(TT, t1 - t0), 1);

    for (int tb = t0; tb < t1; tb += TT) {
        const int nt = min(TT, t1 - tb);
        if (tb != t0) load_tile(tb, nt, 2);
        if (tb == t0) {
            const float qscale = (1.f / sqrtf((float)HD)) * 1.4426950408889634f;
            const bf16 *qh = q + (size_t)r * q_stride + (size_t)h * G * HD;
            for (int i = tid; i < G * HD; i += 128) sm.q[i] = to_f(__ldcg(qh + i)) * qscale;
            if (tid < ATTN_MAX_G) { sm.m[tid] = -INFINITY; sm.l[tid] = 0.f; }
        }
        cp_async_wait_all();
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
    for (int i = tid; i < G * HD; i += 128) {
        const int g = i / HD, d = i % HD, hq = h * G + g;
        float A = 0.f;
#pragma unroll
        for (int sl = 0; sl < TS; ++sl) A += s_acc[(sl * ATTN_MAX_G + g) * HD + d];
        if (n_used == 1) {
            o[(size_t)r * n_q_heads * HD + (size_t)hq * HD + d] = to_bf(A / sm.l[g]);
        } else {
            const size_t slot = ((size_t)r * n_q_heads + hq) * n_splits + z;
            part_o[slot * HD + d] = A;
            if (d == 0) { part_ml[slot * 2] = sm.m[g]; part_ml[slot * 2 + 1] = sm.l[g]; }
        }
    }
    if (n_used == 1) return;

    // The last of the n_used blocks of (r, h) to finish merges them: o[r, hq, :] =
    // sum_z part_o * 2^(m_z - M) / sum_z l_z * 2^(m_z - M), z = 0, 1, ... in order (the same bits
    // whichever block is last). sem[r, h] counts arrivals and is reset by the merging block.
    __threadfence();
    __syncthreads();
    if (tid == 0) {
        int *cnt = sem + (size_t)r * n_kv_heads + h;
        const bool last = atomicAdd(cnt, 1) == n_used - 1;
        if (last) atomicExch(cnt, 0);
        sm.merge = last;
    }
    __syncthreads();
    if (!sm.merge) return;
    __threadfence();
    for (int i = tid; i < G * HD; i += 128) {
        const int g = i / HD, d = i % HD, hq = h * G + g;
        const size_t base = ((size_t)r * n_q_heads + hq) * n_splits;
        float M = -INFINITY;
        for (int zz = 0; zz < n_used; ++zz) M = fmaxf(M, __ldcg(part_ml + (base + zz) * 2));
        float L = 0.f, A = 0.f;
        for (int zz = 0; zz < n_used; ++zz) {
            const float w = exp2f(__ldcg(part_ml + (base + zz) * 2) - M);
            L += __ldcg(part_ml + (base + zz) * 2 + 1) * w;
            A += __ldcg(part_o + (base + zz) * HD + d) * w;
        }
        o[(size_t)r * n_q_heads * HD + (size_t)hq * HD + d] = to_bf(A / L);
    }
}

extern "C" __global__ void __launch_bounds__(128, 4)
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
    if (r >= rows || n_q_heads / n_kv_heads > ATTN_MAX_G) return;
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

extern "C" __global__ void __launch_bounds__(128)
attention_prefill(const bf16 *__restrict__ q, const char *__restrict__ kv_state,
                  const int *__restrict__ page_table, const int *__restrict__ cu_seqlens,
                  const int *__restrict__ pos, float *__restrict__ part_o,
                  float *__restrict__ part_ml, bf16 *__restrict__ o, int rows, int n_seqs,
                  int pages_per_seq, int layer, int n_layers, int n_q_heads, int n_kv_heads,
                  int head_dim, int page_tokens, int split_tokens, int q_stride) {
    __shared__ float smem[ATTN_SMEM];
    const int r = blockIdx.x;
    if (r >= rows || n_q_heads / n_kv_heads > ATTN_MAX_G) return;
    const int s = seq_of_row(cu_seqlens, n_seqs, r);
    ATTN_DISPATCH(q, kv_state, page_table, s, pos[r], part_o, part_ml, o, r, pages_per_seq,
                  layer, n_layers, n_q_heads, n_kv_heads, page_tokens, split_tokens, q_stride,
                  smem)
}

// o[r, hq, :] = sum_z part_o[r, hq, z, :] * 2^(m_z - M) / sum_z l_z * 2^(m_z - M), z in order,
// over the splits with l_z > 0. The split weights are computed once per block (chunks of
// COMB_CHUNK splits in shared memory), then each thread adds its dims in order z = 0, 1, ...
#define COMB_CHUNK 256
extern "C" __global__ void attention_combine(const float *__restrict__ part_o,
                                             const float *__restrict__ part_ml,
                                             bf16 *__restrict__ o, int rows, int n_q_heads,
                                             int head_dim, int n_splits) {
    __shared__ float s_w[COMB_CHUNK], s_l[COMB_CHUNK], s_red[32];
    const int r = blockIdx.x, hq = blockIdx.y;
    pdl_wait();
    pdl_launch_dependents();
    if (r >= rows || hq >= n_q_heads) return;
    const size_t base = ((size_t)r * n_q_heads + hq) * n_splits;
    float mx = -INFINITY;
    for (int z = threadIdx.x; z < n_splits; z += blockDim.x)
        if (part_ml[(base + z) * 2 + 1] > 0.f) mx = fmaxf(mx, part_ml[(base + z) * 2]);
    mx = warp_max(mx);
    if ((threadIdx.x & 31) == 0) s_red[threadIdx.x >> 5] = mx;
    __syncthreads();
    float M = -INFINITY;
    for (int w = 0; w < (int)(blockDim.x + 31) >> 5; ++w) M = fmaxf(M, s_red[w]);
    float L[2] = {0.f, 0.f}, A[2] = {0.f, 0.f};  // dims threadIdx.x and threadIdx.x + blockDim.x
    for (int c0 = 0; c0 < n_splits; c0 += COMB_CHUNK) {
        const int cn = min(COMB_CHUNK, n_splits - c0);
        __syncthreads();
        for (int i = threadIdx.x; i < cn; i += blockDim.x) {
            const float lz = part_ml[(base + c0 + i) * 2 + 1];
            const float w = lz > 0.f ? exp2f(part_ml[(base + c0 + i) * 2] - M) : 0.f;
            s_w[i] = w;
            s_l[i] = lz > 0.f ? lz : 0.f;
        }
        __syncthreads();
        for (int j = 0; j < 2; ++j) {
            const int d = threadIdx.x + j * blockDim.x;
            if (d >= head_dim) break;
            // 8 independent loads, then the adds in order z (skipped splits add nothing)
            for (int i0 = 0; i0 < cn; i0 += 8) {
                float v[8];
#pragma unroll
                for (int u = 0; u < 8; ++u)
                    v[u] = (i0 + u < cn && s_l[i0 + u] > 0.f) ? part_o[(base + c0 + i0 + u) * head_dim + d] : 0.f;
#pragma unroll
                for (int u = 0; u < 8; ++u) {
                    if (i0 + u < cn && s_l[i0 + u] > 0.f) {
                        L[j] += s_l[i0 + u] * s_w[i0 + u];
                        A[j] += v[u] * s_w[i0 + u];
                    }
                }
            }
        }
    }
    for (int j = 0; j < 2; ++j) {
        const int d = threadIdx.x + j * blockDim.x;
        if (d < head_dim)
            o[(size_t)r * n_q_heads * head_dim + (size_t)hq * head_dim + d] = to_bf(A[j] / L[j]);
    }
}
