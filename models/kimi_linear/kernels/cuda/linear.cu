// The batch-invariant build's plain bf16 projections, y[rows, N] = x[rows, K] @ W[N, K]^T
// (docs/determinism.md): KDA's and MLA's projections, the dense and shared experts' MLPs. The
// llama family fuses the norm, SwiGLU or the residual add into each of its projections; this
// family's calls keep the cpu reference's shape (a projection from a normed h into a buffer of
// its own), so they need the plain one, which llama ships only with an f32 output (gemv_f32, and
// Qwen3-MoE's moe_router_gemm for many rows, which the manifest launches for the f32 ones).
//
// Both reduce each output in the one K order of llama's gemv.cuh and common gemm_wg.cuh (K in
// units of 256, partial p taking units p, p + 8, ..., each a chain of k16 steps of 16
// consecutive elements, the 8 partials added in order from 0), so a row gets the same bits from
// the gemv (decode's few rows) as from the wgmma kernel (prefill's and the wide decode's rows)
// at any M, beside any rows. Neither launches under programmatic dependent launch.
#include "gemv.cuh"
#include "gemm_wg.cuh"

#if !defined(WG_BN) || !defined(WG_BIG_SMEM) || !defined(WG_SPLIT_SMEM)
#error "the WG_* constants come from the family's table.py (kern_models.common.cubins passes them as -D)"
#endif
// llama's prefill shape: 128 x rows (two consumer warpgroups) beside 128 W rows, 6 stages.
using WgBig = WgCfg<WG_BN, 2, 6>;
static_assert(WgBig::SMEM == WG_BIG_SMEM, "table.py's WG_* constants");
// llama's wide decode shape: 64 x rows (one consumer) beside 128 W rows, 8 stages, K split over
// 8 blocks a tile (gemm_wg.cuh's split: the last of a tile's blocks adds the 8 partials in order).
using WgSplit = WgCfg<WG_BN, 1, 8>;
static_assert(WgSplit::SMEM == WG_SPLIT_SMEM, "table.py's WG_* constants");

// Decode: grid (ceil_div(N, GEMV_COLS)), block 32 * GEMV_WARPS; rows past 32 go in passes.
extern "C" __global__ void __launch_bounds__(32 * GEMV_WARPS, 2)
linear_gemv(const bf16 *__restrict__ x, const bf16 *__restrict__ W, bf16 *__restrict__ y, int rows, int N, int K) {
    gemv(XPlain{x}, W, YBf16{y}, rows, N, K);
}

// Many rows: grid (ceil_div(N, WG_BN), ceil_div(rows, 128)), block WgBig::THREADS, dynamic shared
// memory WG_BIG_SMEM. x and W are tensor maps (kern's `tiles<32,64>` params), not arrays.
extern "C" __global__ void __launch_bounds__(WgBig::THREADS, 1)
linear_gemm(const bf16 *__restrict__ x, const bf16 *__restrict__ W, bf16 *__restrict__ y, int rows, int N, int K) {
    gemm_wg<WgBig>(nullptr, nullptr, nullptr, YBf16{y}, rows, N, K, nullptr, nullptr, x, W);
}

// The wide decode's few rows of a projection with few column tiles (KDA's low-rank and beta
// projections, the o projections, MLA's latent): linear_gemm's bits, 8 blocks a tile where the
// unsplit kernel gave one block the whole K. part: scratch floats a (tile, partial)
// WgSplit::PART; sem: a counter a tile, zero between launches (the last block resets it).
// Grid (ceil_div(N, WG_BN), ceil_div(rows, 64), 8), block WgSplit::THREADS, dynamic shared
// memory WG_SPLIT_SMEM; x and W tensor maps as linear_gemm's.
extern "C" __global__ void __launch_bounds__(WgSplit::THREADS, 1)
linear_gemm_split(const bf16 *__restrict__ x, const bf16 *__restrict__ W, bf16 *__restrict__ y, float *__restrict__ part,
                  int *sem, int rows, int N, int K) {
    gemm_wg<WgSplit>(nullptr, nullptr, nullptr, YBf16{y}, rows, N, K, part, sem, x, W);
}
