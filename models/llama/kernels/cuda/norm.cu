// RMSNorm and the fused residual add + RMSNorm (llama family, Qwen3).
// Numerics follow transformers' LlamaRMSNorm: fp32 mean of squares, x * 1/sqrt(var + eps)
// rounded to bf16, then times the bf16 weight (rounded to bf16 again).
// Layout: x, res, y are [rows, hidden] row-major bf16; w is [hidden]. hidden % 8 == 0.
// Grid (rows), block 256 (any multiple of 32 up to 1024 works). rms_norm may be launched with
// PDL: it waits for the previous kernel and reads x at L2.
#include "common.cuh"

__device__ __forceinline__ void norm_row(const bf16 *src, const bf16 *w, bf16 *y, int hidden,
                                         float eps, float *scratch) {
    const uint4 *s8 = reinterpret_cast<const uint4 *>(src);
    const uint4 *w8 = reinterpret_cast<const uint4 *>(w);
    uint4 *y8 = reinterpret_cast<uint4 *>(y);
    const int n8 = hidden >> 3;
    float ss = 0.f;
    for (int i = threadIdx.x; i < n8; i += blockDim.x) {
        float f[8];
        unpack8(__ldcg(s8 + i), f);
#pragma unroll
        for (int j = 0; j < 8; ++j) ss += f[j] * f[j];
    }
    const float total = block_sum(ss, scratch);
    const float r = 1.f / sqrtf(total / (float)hidden + eps);
    for (int i = threadIdx.x; i < n8; i += blockDim.x) {
        float f[8], g[8];
        unpack8(__ldcg(s8 + i), f);
        unpack8(w8[i], g);
#pragma unroll
        for (int j = 0; j < 8; ++j) f[j] = g[j] * rbf(f[j] * r);
        y8[i] = pack8(f);
    }
}

extern "C" __global__ void rms_norm(const bf16 *__restrict__ x, const bf16 *__restrict__ w,
                                    bf16 *__restrict__ y, int rows, int hidden, float eps) {
    __shared__ float scratch[32];
    const int r = blockIdx.x;
    if (r >= rows) return;
    pdl_wait();
    pdl_launch_dependents();
    norm_row(x + (size_t)r * hidden, w, y + (size_t)r * hidden, hidden, eps, scratch);
}

// res += x (rounded to bf16 and stored), then y = rmsnorm(res) * w, reading the stored value.
extern "C" __global__ void add_rms_norm(bf16 *__restrict__ res, const bf16 *__restrict__ x,
                                        const bf16 *__restrict__ w, bf16 *__restrict__ y,
                                        int rows, int hidden, float eps) {
    __shared__ float scratch[32];
    const int r = blockIdx.x;
    if (r >= rows) return;
    uint4 *res8 = reinterpret_cast<uint4 *>(res + (size_t)r * hidden);
    const uint4 *x8 = reinterpret_cast<const uint4 *>(x + (size_t)r * hidden);
    const int n8 = hidden >> 3;
    for (int i = threadIdx.x; i < n8; i += blockDim.x) {
        float a[8], b[8];
        unpack8(res8[i], a);
        unpack8(x8[i], b);
#pragma unroll
        for (int j = 0; j < 8; ++j) a[j] += b[j];
        res8[i] = pack8(a);
    }
    __syncthreads();  // each thread re-reads only its own chunks, but keep the order plain
    norm_row(res + (size_t)r * hidden, w, y + (size_t)r * hidden, hidden, eps, scratch);
}
