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
// Grids: rope_table (max_pos), block head_dim/2. rope and qk_norm_rope
// (rows, n_q_heads + n_kv_heads), block head_dim/2 (head_dim/2 a multiple of 32 for
// qk_norm_rope).
#include "common.cuh"

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

// Rotate the pair (x0 = x[i], x1 = x[i + half]) for position p.
__device__ __forceinline__ void rotate(float &x0, float &x1, const float *table, int p, int i,
                                       int head_dim) {
    const float c = rbf(table[(size_t)p * head_dim + i]);
    const float s = rbf(table[(size_t)p * head_dim + (head_dim >> 1) + i]);
    const float y0 = rbf(rbf(x0 * c) - rbf(x1 * s));
    const float y1 = rbf(rbf(x1 * c) + rbf(x0 * s));
    x0 = y0;
    x1 = y1;
}

__device__ __forceinline__ bf16 *head_ptr(bf16 *q, bf16 *k, int r, int h, int n_q_heads,
                                          int head_dim, int q_stride, int k_stride) {
    return h < n_q_heads ? q + (size_t)r * q_stride + (size_t)h * head_dim
                         : k + (size_t)r * k_stride + (size_t)(h - n_q_heads) * head_dim;
}

extern "C" __global__ void rope(bf16 *q, bf16 *k, const int *__restrict__ pos,
                                const float *__restrict__ table, int rows, int n_q_heads,
                                int n_kv_heads, int head_dim, int q_stride, int k_stride) {
    const int r = blockIdx.x, h = blockIdx.y, i = threadIdx.x, half = head_dim >> 1;
    if (r >= rows || h >= n_q_heads + n_kv_heads || i >= half) return;
    bf16 *x = head_ptr(q, k, r, h, n_q_heads, head_dim, q_stride, k_stride);
    float x0 = to_f(x[i]), x1 = to_f(x[i + half]);
    rotate(x0, x1, table, pos[r], i, head_dim);
    x[i] = to_bf(x0);
    x[i + half] = to_bf(x1);
}

// Qwen3: per-head RMSNorm of q (weight qw[head_dim]) and k (weight kw[head_dim]), then rope.
extern "C" __global__ void qk_norm_rope(bf16 *q, bf16 *k, const bf16 *__restrict__ qw,
                                        const bf16 *__restrict__ kw, const int *__restrict__ pos,
                                        const float *__restrict__ table, int rows, int n_q_heads,
                                        int n_kv_heads, int head_dim, int q_stride, int k_stride,
                                        float eps) {
    __shared__ float scratch[32];
    const int r = blockIdx.x, h = blockIdx.y, i = threadIdx.x, half = head_dim >> 1;
    if (r >= rows || h >= n_q_heads + n_kv_heads) return;  // whole block leaves together
    bf16 *x = head_ptr(q, k, r, h, n_q_heads, head_dim, q_stride, k_stride);
    const bf16 *w = h < n_q_heads ? qw : kw;
    float x0 = 0.f, x1 = 0.f;
    if (i < half) {
        x0 = to_f(x[i]);
        x1 = to_f(x[i + half]);
    }
    const float ss = block_sum(x0 * x0 + x1 * x1, scratch);
    const float rs = 1.f / sqrtf(ss / (float)head_dim + eps);
    if (i >= half) return;
    x0 = rbf(to_f(w[i]) * rbf(x0 * rs));
    x1 = rbf(to_f(w[i + half]) * rbf(x1 * rs));
    rotate(x0, x1, table, pos[r], i, head_dim);
    x[i] = to_bf(x0);
    x[i + half] = to_bf(x1);
}
