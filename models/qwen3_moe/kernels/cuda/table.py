"""The Qwen3-MoE CUDA kernels (moe.cu, moe_wg.cu), one typed table in the llama family's form
(kern_models.llama.kernels.cuda.table: Kernel, Op): module, entry, parameters, grid, block. The
invariant block's kernels after the router (moe_route_sort, moe_wg_gate_up, moe_wg_down,
moe_combine_residual) launch with programmatic dependent launch, LATE: each waits at entry,
before it reads or writes anything, then lets the next launch, so the one after it may start
while it runs but reads nothing early (common.cuh); the others launch without it."""

from __future__ import annotations

from kern_models.common.kernel_table import ARCH, Kernel, Op, Pdl, buffer_param, int_params
from kern_models.llama.kernels.cuda.table import TILES as DENSE_TILES

MODULE = "moe"
WG_MODULE = "moe_wg"  # the batch-invariant block (moe_wg.cu): llama's gemv order, on mma.sync and wgmma
# Tile constants the grids below and moe.cu share (passed to nvcc as -D, as the llama table's).
TILES = {
    "MOE_BM": 64,    # grouped GEMM: sorted (row, choice) pairs a tile (a tile never crosses an expert)
    "MOE_BN": 64,    # grouped GEMM: output columns a tile
    "MOE_BK": 32,    # grouped GEMM: the reduction's step (K % MOE_BK == 0)
    "MOE_COLS": 8,   # gather gemv: output columns a block (a warp a column)
}
# moe_route_sort's bounds (moe.cu's MOE_FUSED_EXPERTS and MOE_FUSED_PAIRS: its shared memory, a
# warp's router scratch and the pairs' ids); the generator fuses only within them
FUSED_EXPERTS = 256
FUSED_PAIRS = 2048
# What nvcc gets: these, and the llama family's constants that gemv.cuh and gemm_wg.cuh read
# (moe_wg.cu runs their arithmetic, so a row gets the gemv's bits).
DEFINES = {**TILES, **{k: DENSE_TILES[k] for k in ("GEMV_WARPS", "GEMV_COLS", "WG_BN", "WG_SPLIT_SMEM")}}
MAX_EXPERTS = 1024  # moe_pairs.cuh's MOE_MAX_EXPERTS
MAX_TOP_K = 32      # moe_route: one lane a choice
GEMV_MAX_PAIRS = 1024  # moe_pairs.cuh's MOE_GEMV_MAX_PAIRS: moe_gemv_gate_up's pairs a launch (rows * top_k)
GEMV_BLOCK = (32 * TILES["MOE_COLS"],)
GROUP_BLOCK = (128,)  # 4 warps of 32 x 32

KERNELS: tuple[Kernel, ...] = (
    Kernel(MODULE, "moe_route", (buffer_param("logits", "f32"), buffer_param("ids", "i32", "out"), buffer_param("weights", "f32", "out"),
                                 *int_params("rows", "experts", "top_k", "norm_topk")), ("rows",), (32,)),
    Kernel(MODULE, "moe_gemv_gate_up", (buffer_param("x"), buffer_param("ids", "i32"), buffer_param("W"), buffer_param("act", direction="out"),
                                        *int_params("rows", "top_k", "inter", "hidden", "first", "count")),
           ({"ceil_div": ["inter", TILES["MOE_COLS"]]}, {"mul": ["rows", "top_k"]}), GEMV_BLOCK),
    Kernel(MODULE, "moe_gemv_down_residual", (buffer_param("act"), buffer_param("ids", "i32"), buffer_param("weights", "f32"), buffer_param("W"),
                                              buffer_param("res", direction="inout"),
                                              *int_params("rows", "top_k", "hidden", "inter")),
           ("rows", {"ceil_div": ["hidden", TILES["MOE_COLS"]]}), GEMV_BLOCK),
    Kernel(MODULE, "moe_gemv_down_push", (buffer_param("act"), buffer_param("ids", "i32"), buffer_param("weights", "f32"), buffer_param("W"),
                                          buffer_param("recv", "f32", "out"), buffer_param("parts", "u64"),
                                          *int_params("rows", "top_k", "hidden", "inter", "first", "count", "rank", "ranks",
                                                 "offset")),
           ("rows", {"ceil_div": ["hidden", TILES["MOE_COLS"]]}), GEMV_BLOCK),
    Kernel(MODULE, "moe_sort", (buffer_param("ids", "i32"), buffer_param("sorted", "i32", "out"), buffer_param("pos", "i32", "out"),
                                buffer_param("tiles", "i32", "out"), *int_params("n_pairs", "experts")), (1,), (1024,)),
    Kernel(MODULE, "moe_route_sort", (buffer_param("logits", "f32"), buffer_param("ids", "i32", "out"), buffer_param("weights", "f32", "out"),
                                      buffer_param("sorted", "i32", "out"), buffer_param("pos", "i32", "out"),
                                      buffer_param("tiles", "i32", "out"), *int_params("rows", "experts", "top_k", "norm_topk")),
           (1,), (1024,), pdl=Pdl.LATE),
    Kernel(MODULE, "moe_group_gate_up", (buffer_param("x"), buffer_param("sorted", "i32"), buffer_param("tiles", "i32"), buffer_param("W"),
                                         buffer_param("act", direction="out"),
                                         *int_params("top_k", "inter", "hidden", "first", "count")),
           ({"ceil_div": ["inter", TILES["MOE_BN"]]}, "max_tiles"), GROUP_BLOCK),
    Kernel(MODULE, "moe_group_down", (buffer_param("act"), buffer_param("tiles", "i32"), buffer_param("W"), buffer_param("y", "f32", "out"),
                                      *int_params("hidden", "inter", "first", "count")),
           ({"ceil_div": ["hidden", TILES["MOE_BN"]]}, "max_tiles"), GROUP_BLOCK),
    Kernel(MODULE, "moe_combine", (buffer_param("y", "f32"), buffer_param("pos", "i32"), buffer_param("weights", "f32"),
                                   buffer_param("out", direction="out"), *int_params("rows", "top_k", "hidden")),
           ("rows", {"ceil_div": ["hidden", 256]}), (256,)),
    Kernel(MODULE, "moe_combine_part", (buffer_param("y", "f32"), buffer_param("pos", "i32"), buffer_param("ids", "i32"),
                                        buffer_param("weights", "f32"), buffer_param("out", direction="out"),
                                        *int_params("rows", "top_k", "hidden", "first", "count")),
           ("rows", {"ceil_div": ["hidden", 256]}), (256,)),
)
# moe_wg.cu: narrow decode's gather gemvs (a block a chosen expert and 8 pairs of W rows / 16 W
# rows), the grouped projections over moe_sort's tiles on wgmma (a producer and one consumer
# warpgroup, 64 positions beside WG_BN W rows), the router's many-row logits (the same shape,
# 64 rows a block) and the combine into the residual (or, expert parallel, into every rank's slot).
_GATHER_BLOCK = (32 * DENSE_TILES["GEMV_WARPS"],)
_WG_BLOCK = (256,)
_EXPERT_SMEM = DENSE_TILES["WG_SPLIT_SMEM"]
_RANGE = int_params("first", "count")
# The grouped projections are persistent (a block walks work items: moe_sort's tiles beside
# column tiles): one block a multiprocessor of an H100 / H200 (their 197 KB of shared memory
# hold one). Any count is correct; fewer multiprocessors run the blocks in turn.
MOE_WG_BLOCKS = 132
WG_PARTS = 8  # gemm_wg.cuh's partials: a split GEMM's grid z
KERNELS += (
    Kernel(WG_MODULE, "moe_gather_gate_up", (buffer_param("x"), buffer_param("ids", "i32"), buffer_param("W"), buffer_param("act", direction="out"),
                                             *int_params("rows", "top_k", "inter", "hidden"), *_RANGE),
           ({"ceil_div": ["inter", DENSE_TILES["GEMV_COLS"] // 2]}, {"mul": ["rows", "top_k"]}), _GATHER_BLOCK),
    Kernel(WG_MODULE, "moe_gather_down", (buffer_param("act"), buffer_param("ids", "i32"), buffer_param("W"), buffer_param("y", "f32", "out"),
                                          *int_params("rows", "top_k", "hidden", "inter"), *_RANGE),
           ({"ceil_div": ["hidden", DENSE_TILES["GEMV_COLS"]]}, {"mul": ["rows", "top_k"]}), _GATHER_BLOCK),
    Kernel(WG_MODULE, "moe_wg_gate_up", (buffer_param("x"), buffer_param("sorted", "i32"), buffer_param("tiles", "i32"), buffer_param("W"),
                                         buffer_param("act", direction="out"), *int_params("top_k", "inter", "hidden"), *_RANGE),
           (MOE_WG_BLOCKS,), _WG_BLOCK, shared_mem=_EXPERT_SMEM, pdl=Pdl.LATE),
    Kernel(WG_MODULE, "moe_wg_down", (buffer_param("act"), buffer_param("sorted", "i32"), buffer_param("tiles", "i32"), buffer_param("W"),
                                      buffer_param("y", "f32", "out"), *int_params("hidden", "inter"), *_RANGE),
           (MOE_WG_BLOCKS,), _WG_BLOCK, shared_mem=_EXPERT_SMEM, pdl=Pdl.LATE),
    Kernel(WG_MODULE, "moe_router_gemm", (buffer_param("x"), buffer_param("W"), buffer_param("y", "f32", "out"), *int_params("rows", "N", "K")),
           ({"ceil_div": ["N", DENSE_TILES["WG_BN"]]}, {"ceil_div": ["rows", 64]}), _WG_BLOCK, shared_mem=_EXPERT_SMEM),
    Kernel(WG_MODULE, "moe_router_gemm_split", (buffer_param("x"), buffer_param("W"), buffer_param("y", "f32", "out"),
                                                buffer_param("part", "f32", "out"), buffer_param("sem", "i32", "inout"),
                                                *int_params("rows", "N", "K")),
           ({"ceil_div": ["N", DENSE_TILES["WG_BN"]]}, {"ceil_div": ["rows", 64]}, WG_PARTS), _WG_BLOCK,
           shared_mem=_EXPERT_SMEM),
    Kernel(WG_MODULE, "moe_combine_residual", (buffer_param("y", "f32"), buffer_param("ids", "i32"), buffer_param("weights", "f32"),
                                               buffer_param("res", direction="inout"), *int_params("rows", "top_k", "hidden"),
                                               *_RANGE), ("rows", {"ceil_div": ["hidden", 256]}), (256,), pdl=Pdl.LATE),
    Kernel(WG_MODULE, "moe_combine_push", (buffer_param("y", "f32"), buffer_param("ids", "i32"), buffer_param("weights", "f32"),
                                           buffer_param("recv", "f32", "out"), buffer_param("parts", "u64"),
                                           *int_params("rows", "top_k", "hidden"), *_RANGE,
                                           *int_params("rank", "ranks", "offset")),
           ("rows", {"ceil_div": ["hidden", 256]}), (256,)),
)
BY_ENTRY = {k.entry: k for k in KERNELS}
# moe.cu's grouped GEMMs' grid reads the tiles' bound; moe_wg.cu's persistent ones take it too
# (the verifier bounds it), their grid one block a multiprocessor
_TILED = ("max_tiles: i32",)
OPS = {
    "moe_route": Op(("moe_route",)), "moe_gemv_gate_up": Op(("moe_gemv_gate_up",)),
    "moe_gemv_down_residual": Op(("moe_gemv_down_residual",)), "moe_sort": Op(("moe_sort",)),
    "moe_route_sort": Op(("moe_route_sort",)),
    "moe_group_gate_up": Op(("moe_group_gate_up",), (*BY_ENTRY["moe_group_gate_up"].params, *_TILED)),
    "moe_group_down": Op(("moe_group_down",), (*BY_ENTRY["moe_group_down"].params, *_TILED)),
    "moe_combine": Op(("moe_combine",)), "moe_gemv_down_push": Op(("moe_gemv_down_push",)),
    "moe_combine_part": Op(("moe_combine_part",)),
    "moe_gather_gate_up": Op(("moe_gather_gate_up",)), "moe_gather_down": Op(("moe_gather_down",)),
    "moe_wg_gate_up": Op(("moe_wg_gate_up",), (*BY_ENTRY["moe_wg_gate_up"].params, *_TILED)),
    "moe_wg_down": Op(("moe_wg_down",), (*BY_ENTRY["moe_wg_down"].params, *_TILED)),
    "moe_router_gemm": Op(("moe_router_gemm",)), "moe_router_gemm_split": Op(("moe_router_gemm_split",)),
    "moe_combine_residual": Op(("moe_combine_residual",)),
    "moe_combine_push": Op(("moe_combine_push",)),
}


def ops() -> dict:
    """Every MoE op the generator may emit, as manifest JSON."""
    return {name: op.to_manifest(BY_ENTRY) for name, op in OPS.items()}


__all__ = ["ARCH", "DEFINES", "KERNELS", "MODULE", "TILES", "WG_MODULE", "ops"]
