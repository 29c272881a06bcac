// Test-only reference kernels (tests/cuda builds them beside the shipped ones; no manifest
// launches them): the row-parallel attention that prefill_attention.cu replaced, kept as its
// cross-check, and the combine of its splits.
//
// One block per (query row r, kv head h, context split z): it serves the G = n_q_heads /
// n_kv_heads query heads that share kv head h, over context positions
// [z*split_tokens, min(pos[r]+1, (z+1)*split_tokens)) of the sequence that owns r (rows packed
// by cu_seqlens). Each of the 4 warps takes every 4th token of the split; lanes split head_dim;
// scores are reduced by a fixed xor tree, warps are merged in index order: deterministic. With
// gridDim.z == 1 the block writes o directly; else unnormalized partials (part_o[r, hq, z, :],
// part_ml[r, hq, z, {max, sum}], log2 domain) that attention_combine merges in order z.
// head_dim in {64, 128, 256}; G <= 8. Grid (rows, n_kv_heads, n_splits), block 128. Combine:
// grid (rows, n_q_heads), block head_dim.
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
    const float qscale = (1.f / sqrtf((float)HD)) * LOG2E;  // 1/sqrt(d) * log2(e)

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
