// Skinny matrix products for decode rows: y[rows, N] = x[rows, K] @ W[N, K]^T
// (transformers' Linear layout: W is [out_features, in_features], row-major, bf16).
// One warp per output column n: lanes stream W[n, :] in 16-byte loads (8 bf16), fp32
// accumulate, a fixed xor-tree reduction, so results are bitwise deterministic. Rows go in
// groups of 8 (W re-read per group from L2): best for rows <= 8, correct for any rows.
// gemv_bf16 writes bf16 y, gemv_f32 writes fp32 y (LM-head logits).
// K % 8 == 0, pointers 16-byte aligned. Grid (ceil_div(N, 8)), block 256.
#include "common.cuh"

#define GEMV_ROWS 8

template <typename OutT>
__device__ __forceinline__ void store(OutT *y, float v);
template <> __device__ __forceinline__ void store<float>(float *y, float v) { *y = v; }
template <> __device__ __forceinline__ void store<bf16>(bf16 *y, float v) { *y = to_bf(v); }

template <typename OutT>
__device__ __forceinline__ void gemv(const bf16 *__restrict__ x, const bf16 *__restrict__ W,
                                     OutT *__restrict__ y, int rows, int N, int K) {
    const int lane = threadIdx.x & 31;
    const int n = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (n >= N) return;
    const int n8 = K >> 3;
    const uint4 *w8 = reinterpret_cast<const uint4 *>(W + (size_t)n * K);
    for (int r0 = 0; r0 < rows; r0 += GEMV_ROWS) {
        const int R = min(GEMV_ROWS, rows - r0);
        float acc[GEMV_ROWS];
#pragma unroll
        for (int i = 0; i < GEMV_ROWS; ++i) acc[i] = 0.f;
#pragma unroll 4
        for (int c = lane; c < n8; c += 32) {
            float wf[8];
            unpack8(w8[c], wf);
#pragma unroll
            for (int i = 0; i < GEMV_ROWS; ++i) {
                if (i >= R) break;
                float xf[8];
                unpack8(reinterpret_cast<const uint4 *>(x + (size_t)(r0 + i) * K)[c], xf);
#pragma unroll
                for (int j = 0; j < 8; ++j) acc[i] += wf[j] * xf[j];
            }
        }
#pragma unroll
        for (int i = 0; i < GEMV_ROWS; ++i) {
            if (i >= R) break;
            const float v = warp_sum(acc[i]);
            if (lane == 0) store<OutT>(y + (size_t)(r0 + i) * N + n, v);
        }
    }
}

extern "C" __global__ void __launch_bounds__(256)
gemv_bf16(const bf16 *__restrict__ x, const bf16 *__restrict__ W, bf16 *__restrict__ y, int rows,
          int N, int K) {
    gemv<bf16>(x, W, y, rows, N, K);
}

extern "C" __global__ void __launch_bounds__(256)
gemv_f32(const bf16 *__restrict__ x, const bf16 *__restrict__ W, float *__restrict__ y, int rows,
         int N, int K) {
    gemv<float>(x, W, y, rows, N, K);
}
