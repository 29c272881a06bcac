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
// With gridDim.z == 1 the block writes o directly. With gridDim.z > 1 it writes unnormalized
// partials (part_o[r, hq, z, :], part_ml[r, hq, z, {max, sum}], log2 domain) and
// attention_combine merges the splits in order z = 0, 1, ... into o.
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

extern "C" __global__ void __launch_bounds__(128)
attention_decode(const bf16 *__restrict__ q, const char *__restrict__ kv_state,
                 const int *__restrict__ page_table, const int *__restrict__ pos,
                 float *__restrict__ part_o, float *__restrict__ part_ml, bf16 *__restrict__ o,
                 int rows, int pages_per_seq, int layer, int n_layers, int n_q_heads,
                 int n_kv_heads, int head_dim, int page_tokens, int split_tokens, int q_stride) {
    __shared__ float smem[ATTN_SMEM];
    const int r = blockIdx.x;
    if (r >= rows || n_q_heads / n_kv_heads > ATTN_MAX_G) return;
    ATTN_DISPATCH(q, kv_state, page_table, r, pos[r], part_o, part_ml, o, r, pages_per_seq,
                  layer, n_layers, n_q_heads, n_kv_heads, page_tokens, split_tokens, q_stride,
                  smem)
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

// o[r, hq, :] = sum_z part_o[r, hq, z, :] * 2^(m_z - M) / sum_z l_z * 2^(m_z - M), z in order.
extern "C" __global__ void attention_combine(const float *__restrict__ part_o,
                                             const float *__restrict__ part_ml,
                                             bf16 *__restrict__ o, int rows, int n_q_heads,
                                             int head_dim, int n_splits) {
    const int r = blockIdx.x, hq = blockIdx.y;
    if (r >= rows || hq >= n_q_heads) return;
    const size_t base = ((size_t)r * n_q_heads + hq) * n_splits;
    float M = -INFINITY;
    for (int z = 0; z < n_splits; ++z)
        if (part_ml[(base + z) * 2 + 1] > 0.f) M = fmaxf(M, part_ml[(base + z) * 2]);
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float L = 0.f, A = 0.f;
        for (int z = 0; z < n_splits; ++z) {
            const float lz = part_ml[(base + z) * 2 + 1];
            if (!(lz > 0.f)) continue;
            const float w = exp2f(part_ml[(base + z) * 2] - M);
            L += lz * w;
            A += part_o[(base + z) * head_dim + d] * w;
        }
        o[(size_t)r * n_q_heads * head_dim + (size_t)hq * head_dim + d] = to_bf(A / L);
    }
}
