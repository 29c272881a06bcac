// Row gathers: token embedding lookup and the last row of each sequence.
// hidden % 8 == 0 (16-byte copies). Grid (rows) / (n_seqs), block 256.
#include "common.cuh"

// x[r, :] = W[ids[r], :]
extern "C" __global__ void embed(const int *__restrict__ ids, const bf16 *__restrict__ W,
                                 bf16 *__restrict__ x, int rows, int hidden) {
    const int r = blockIdx.x;
    if (r >= rows) return;
    pdl_launch_dependents();  // the next kernel may start streaming its weights
    const uint4 *src = reinterpret_cast<const uint4 *>(W + (size_t)ids[r] * hidden);
    uint4 *dst = reinterpret_cast<uint4 *>(x + (size_t)r * hidden);
    for (int i = threadIdx.x; i < (hidden >> 3); i += blockDim.x) dst[i] = src[i];
}

// y[s, :] = x[cu_seqlens[s+1] - 1, :]
extern "C" __global__ void gather_last(const bf16 *__restrict__ x, const int *__restrict__ cu_seqlens,
                                       bf16 *__restrict__ y, int n_seqs, int hidden) {
    const int s = blockIdx.x;
    if (s >= n_seqs) return;
    const int r = cu_seqlens[s + 1] - 1;
    const uint4 *src = reinterpret_cast<const uint4 *>(x + (size_t)r * hidden);
    uint4 *dst = reinterpret_cast<uint4 *>(y + (size_t)s * hidden);
    for (int i = threadIdx.x; i < (hidden >> 3); i += blockDim.x) dst[i] = src[i];
}
