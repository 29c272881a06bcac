// Append this step's K and V rows to the paged KV state.
// k, v: [rows, n_kv_heads*head_dim] with row stride kv_stride (elements), so they may be
// column slices of one fused qkv buffer. Row r belongs to sequence s with
// cu_seqlens[s] <= r < cu_seqlens[s+1] and sits at token position pos[r]; its physical page
// is page_table[s * pages_per_seq + pos[r] / page_tokens]. Page layout: see common.cuh.
// head_dim % 8 == 0. Grid (rows, n_kv_heads), block 32 (one 16-byte chunk of k or v per
// thread per step; any multiple of 32 works).
#include "common.cuh"

extern "C" __global__ void kv_append(const bf16 *__restrict__ k, const bf16 *__restrict__ v,
                                     char *__restrict__ kv_state, const int *__restrict__ page_table,
                                     const int *__restrict__ cu_seqlens, const int *__restrict__ pos,
                                     int pages_per_seq, int rows, int n_seqs, int layer,
                                     int n_layers, int n_kv_heads, int head_dim, int page_tokens,
                                     int kv_stride) {
    const int r = blockIdx.x, h = blockIdx.y;
    if (r >= rows || h >= n_kv_heads) return;
    const int s = seq_of_row(cu_seqlens, n_seqs, r);
    const int p = pos[r];
    const int phys = page_table[(size_t)s * pages_per_seq + p / page_tokens];
    const int tok = p % page_tokens;
    const int n8 = head_dim >> 3;
    for (int c = threadIdx.x; c < 2 * n8; c += blockDim.x) {
        const int which = c / n8, j = c % n8;  // 0 = k, 1 = v
        const bf16 *src = (which ? v : k) + (size_t)r * kv_stride + (size_t)h * head_dim;
        char *dst = kv_state + kv_offset(phys, layer, which, h, tok, n_layers, n_kv_heads,
                                         head_dim, page_tokens);
        reinterpret_cast<uint4 *>(dst)[j] = reinterpret_cast<const uint4 *>(src)[j];
    }
}
