// The many-row projections' two shapes (gemm.cu's twins of the gemv, and allreduce.cu's pushing
// ones for a tensor-parallel split), over the common many-row kernel (gemm_wg.cuh).
#pragma once
#include "gemm_wg.cuh"

#if !defined(WG_BN) || !defined(WG_BIG_SMEM) || !defined(WG_SPLIT_SMEM) || !defined(WG_SPLIT_PART)
#error "the WG_* constants come from the family's TILES (kern_models.common.cubins passes them as -D)"
#endif
// Prefill's shape: 128 x rows (two consumer warpgroups) beside 128 W rows, 6 stages of 32 KB.
// The wide decode's split shape: 64 x rows beside 128 W rows, 8 stages, grid z = 8 partials.
using WgBig = WgCfg<WG_BN, 2, 6>;
using WgSplit = WgCfg<WG_BN, 1, 8>;
static_assert(WgBig::SMEM == WG_BIG_SMEM && WgSplit::SMEM == WG_SPLIT_SMEM && WgSplit::PART == WG_SPLIT_PART,
              "table.py's WG_* constants");
