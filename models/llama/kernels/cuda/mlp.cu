// SwiGLU activation: gate_up is [rows, 2*inter] (gate columns first, then up);
// h[rows, inter] = silu(gate) * up, as transformers computes it in bf16:
// silu rounded to bf16, then the product rounded to bf16.
// inter % 8 == 0. Grid (rows, ceil_div(inter, 8 * 256)), block 256.
#include "common.cuh"

extern "C" __global__ void silu_mul(const bf16 *__restrict__ gate_up, bf16 *__restrict__ h,
                                    int rows, int inter) {
    const int r = blockIdx.x;
    const int i = blockIdx.y * blockDim.x + threadIdx.x;  // index of an 8-wide chunk
    if (r >= rows || i >= (inter >> 3)) return;
    const uint4 *g8 = reinterpret_cast<const uint4 *>(gate_up + (size_t)r * 2 * inter);
    const uint4 *u8 = reinterpret_cast<const uint4 *>(gate_up + (size_t)r * 2 * inter + inter);
    float g[8], u[8];
    unpack8(g8[i], g);
    unpack8(u8[i], u);
#pragma unroll
    for (int j = 0; j < 8; ++j) g[j] = rbf(g[j] / (1.f + expf(-g[j]))) * u[j];
    reinterpret_cast<uint4 *>(h + (size_t)r * inter)[i] = pack8(g);
}
