// Rope and the paged KV append, shared by rope.cu and gemv.cu (whose qkv projection can
// rotate and append in its epilogue). transformers' rotate-half convention: cos and sin are
// rounded to bf16 and every product and the sum are rounded to bf16.
#pragma once
#include "common.cuh"

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

// Where this step's k / v row of kv head kh goes in the paged KV state (kv.cu's layout).
struct KvAppend {
    const bf16 *v;
    char *kv_state;
    const int *page_table, *cu_seqlens;
    int pages_per_seq, n_seqs, layer, n_layers, page_tokens;
    __device__ bf16 *dst(int r, int which, int kh, int p, int n_kv_heads, int head_dim) const {
        const int s = seq_of_row(cu_seqlens, n_seqs, r);
        const int phys = page_table[(size_t)s * pages_per_seq + p / page_tokens];
        return reinterpret_cast<bf16 *>(kv_state + kv_offset(phys, layer, which, kh, p % page_tokens,
                                                             n_layers, n_kv_heads, head_dim, page_tokens));
    }
};
