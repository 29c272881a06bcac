// Rotary position embedding (transformers' rotate-half convention, non-interleaved).
//
// rope_table fills table[max_pos, head_dim] (fp32): table[p, i] = cos(p * inv_freq[i]) and
// table[p, head_dim/2 + i] = sin(p * inv_freq[i]) for i < head_dim/2. inv_freq is computed
// as transformers does, in fp32 without fused multiply-adds: 1 / theta^(2i/head_dim), then
// llama3 scaling (_compute_llama3_parameters) when factor > 0.
//
// rope / qk_norm_rope rotate q[rows, n_q_heads*head_dim] and k[rows, n_kv_heads*head_dim]
// in place (row strides q_stride, k_stride in elements, so q and k may be column slices of
// one fused qkv buffer). As in transformers, cos and sin are rounded to bf16 and every
// product and the sum are rounded to bf16.
// qk_norm_rope_append also writes the rotated k and the v rows to the paged KV state
// (kv_append fused in: Qwen3 decode's one launch for q/k norms, rope and the cache write).
// Grids: rope_table (max_pos), block head_dim/2. The others (rows, n_q_heads + n_kv_heads),
// block head_dim/2 (head_dim/2 a multiple of 32 for the qk_norm variants).
#include "rope.cuh"

extern "C" __global__ void rope_table(float *__restrict__ table, int max_pos, int head_dim,
                                      float theta, float factor, float low_freq_factor,
                                      float high_freq_factor, int original_max_pos) {
    const int p = blockIdx.x, i = threadIdx.x, half = head_dim >> 1;
    if (p >= max_pos || i >= half) return;
    const float expo = __fdiv_rn((float)(2 * i), (float)head_dim);
    const float base = (float)pow((double)theta, (double)expo);  // correctly rounded powf
    float inv = __fdiv_rn(1.f, base);
    if (factor > 0.f) {
        const float old_len = (float)original_max_pos;
        const float low_wl = __fdiv_rn(old_len, low_freq_factor);
        const float high_wl = __fdiv_rn(old_len, high_freq_factor);
        const float wavelen = __fdiv_rn(6.283185307179586f, inv);
        const float inv_llama = wavelen > low_wl ? __fdiv_rn(inv, factor) : inv;
        const float smooth = __fdiv_rn(__fsub_rn(__fdiv_rn(old_len, wavelen), low_freq_factor),
                                       __fsub_rn(high_freq_factor, low_freq_factor));
        const float smoothed =
            __fadd_rn(__fdiv_rn(__fmul_rn(__fsub_rn(1.f, smooth), inv_llama), factor),
                      __fmul_rn(smooth, inv_llama));
        const bool medium = !(wavelen < high_wl) && !(wavelen > low_wl);
        inv = medium ? smoothed : inv_llama;
    }
    const float f = __fmul_rn((float)p, inv);
    table[(size_t)p * head_dim + i] = cosf(f);
    table[(size_t)p * head_dim + half + i] = sinf(f);
}

__device__ __forceinline__ bf16 *head_ptr(bf16 *q, bf16 *k, int r, int h, int n_q_heads,
                                          int head_dim, int q_stride, int k_stride) {
    return h < n_q_heads ? q + (size_t)r * q_stride + (size_t)h * head_dim
                         : k + (size_t)r * k_stride + (size_t)(h - n_q_heads) * head_dim;
}

// One head of one row: optional per-head RMSNorm (Qwen3), rope, store back in place; with an
// append, a k head's rotated row and the matching v row also go to the KV state. Under PDL
// the block waits for the previous kernel before touching q / k, and reads them at L2.
template <bool NORM, bool APPEND>
__device__ __forceinline__ void rope_head(bf16 *q, bf16 *k, const bf16 *qw, const bf16 *kw,
                                          const int *pos, const float *table, int n_q_heads,
                                          int n_kv_heads, int head_dim, int q_stride, int k_stride,
                                          float eps, const KvAppend &app, float *scratch) {
    const int r = blockIdx.x, h = blockIdx.y, i = threadIdx.x, half = head_dim >> 1;
    bf16 *x = head_ptr(q, k, r, h, n_q_heads, head_dim, q_stride, k_stride);
    const int p = pos[r];
    float x0 = 0.f, x1 = 0.f;
    if (i < half) {
        x0 = to_f(__ldcg(x + i));
        x1 = to_f(__ldcg(x + i + half));
    }
    if (NORM) {
        const bf16 *w = h < n_q_heads ? qw : kw;
        const float ss = block_sum(x0 * x0 + x1 * x1, scratch);
        const float rs = 1.f / sqrtf(ss / (float)head_dim + eps);
        if (i < half) {
            x0 = rbf(to_f(w[i]) * rbf(x0 * rs));
            x1 = rbf(to_f(w[i + half]) * rbf(x1 * rs));
        }
    }
    if (i >= half) return;
    rotate(x0, x1, table, p, i, head_dim);
    x[i] = to_bf(x0);
    x[i + half] = to_bf(x1);
    if (APPEND && h >= n_q_heads) {
        const int kh = h - n_q_heads;
        bf16 *dk = app.dst(r, 0, kh, p, n_kv_heads, head_dim);
        bf16 *dv = app.dst(r, 1, kh, p, n_kv_heads, head_dim);
        const bf16 *vr = app.v + (size_t)r * k_stride + (size_t)kh * head_dim;
        dk[i] = to_bf(x0);
        dk[i + half] = to_bf(x1);
        dv[i] = __ldcg(vr + i);
        dv[i + half] = __ldcg(vr + i + half);
    }
}

#define ROPE_GUARD                                                                        \
    const int r = blockIdx.x, h = blockIdx.y;                                             \
    if (r >= rows || h >= n_q_heads + n_kv_heads) return; /* whole block leaves together */ \
    pdl_wait();                                                                           \
    pdl_launch_dependents();

extern "C" __global__ void rope(bf16 *q, bf16 *k, const int *__restrict__ pos,
                                const float *__restrict__ table, int rows, int n_q_heads,
                                int n_kv_heads, int head_dim, int q_stride, int k_stride) {
    ROPE_GUARD
    rope_head<false, false>(q, k, nullptr, nullptr, pos, table, n_q_heads, n_kv_heads, head_dim,
                            q_stride, k_stride, 0.f, KvAppend{}, nullptr);
}

// Qwen3: per-head RMSNorm of q (weight qw[head_dim]) and k (weight kw[head_dim]), then rope.
extern "C" __global__ void qk_norm_rope(bf16 *q, bf16 *k, const bf16 *__restrict__ qw,
                                        const bf16 *__restrict__ kw, const int *__restrict__ pos,
                                        const float *__restrict__ table, int rows, int n_q_heads,
                                        int n_kv_heads, int head_dim, int q_stride, int k_stride,
                                        float eps) {
    __shared__ float scratch[32];
    ROPE_GUARD
    rope_head<true, false>(q, k, qw, kw, pos, table, n_q_heads, n_kv_heads, head_dim, q_stride,
                           k_stride, eps, KvAppend{}, scratch);
}

// qk_norm_rope fused with kv_append (kv.cu): the k heads' blocks also write the rotated k
// row and the v row (v: stride k_stride) to the paged KV state. (Models without q/k norms
// rotate and append in the qkv projection's epilogue: gemv.cu's norm_gemv_rope_append.)
extern "C" __global__ void qk_norm_rope_append(
    bf16 *q, bf16 *k, const bf16 *__restrict__ v, const bf16 *__restrict__ qw,
    const bf16 *__restrict__ kw, char *__restrict__ kv_state, const int *__restrict__ page_table,
    const int *__restrict__ cu_seqlens, const int *__restrict__ pos, const float *__restrict__ table,
    int pages_per_seq, int rows, int n_seqs, int layer, int n_layers, int n_q_heads, int n_kv_heads,
    int head_dim, int page_tokens, int q_stride, int k_stride, float eps) {
    __shared__ float scratch[32];
    ROPE_GUARD
    const KvAppend app{v, kv_state, page_table, cu_seqlens, pages_per_seq, n_seqs, layer, n_layers, page_tokens};
    rope_head<true, true>(q, k, qw, kw, pos, table, n_q_heads, n_kv_heads, head_dim, q_stride,
                          k_stride, eps, app, scratch);
}
