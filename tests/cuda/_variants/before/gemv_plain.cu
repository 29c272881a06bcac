// Test-only: the plain bf16 projection y = x @ W^T, which no manifest launches (decode fuses
// every bf16 projection with a norm or a residual add); the tests check the gemv template with it.
#include "gemv.cuh"

extern "C" __global__ void __launch_bounds__(32 * GEMV_WARPS, 2)
gemv_bf16(const bf16 *__restrict__ x, const bf16 *__restrict__ W, bf16 *__restrict__ y,
          int rows, int N, int K) {
    gemv(XPlain{x}, W, YBf16{y}, rows, N, K);
}
