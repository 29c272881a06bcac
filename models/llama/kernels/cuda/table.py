"""The llama-family CUDA kernels, one typed table: every kernel a manifest launches, with its
module, entry, parameters, grid, block and role under programmatic dependent launch.

The manifest generator (manifest_cuda.py) emits its ops from this table, kern_models.common.cubins passes TILES
to nvcc as -D defines (so a grid here and its kernel's tile are the same number), and
tests/cuda/test_cuda_table.py checks every entry against the .cu sources: names and parameter
types in order, and that every __global__ entry of the sources is launched by a manifest.
KERNELS.md says what each kernel computes; its parameter lists are not restated there.
"""

from __future__ import annotations

from kern_models.common.kernel_table import ARCH, Kernel, Op, Pdl, buffer_param, int_params

# Tile constants shared by the grids below and the kernels (common.cuh refuses a build without
# them; the kernels static_assert the ones their layout is written for).
TILES = {
    "GEMV_WARPS": 8,      # gemv block: 8 warps split K
    "GEMV_COLS": 16,      # gemv: output columns (W rows) a block, one mma tile
    "PF_BM": 64,          # prefill_attention: query rows a tile
    "PF_THREADS": 128,    # prefill_attention: 4 warps of 16 query rows
    "DEC_THREADS": 128,   # attention_decode: 4 warps
    "WG_BN": 128,         # gemm.cu (wgmma): W rows a block (or WG_BN / 2 pairs)
    "WG_BIG_SMEM": 197744,    # prefill's entries: 6 stages of 128 x rows + 128 W rows, 64 K elements
    "WG_SPLIT_SMEM": 197776,  # the wide decode's *_split: 8 stages of 64 x rows + 128 W rows
    "WG_SPLIT_PART": 8192,    # *_split: scratch floats a (tile, partial): 64 rows x 128 columns
}

EPS = "eps: f32"
GEMV_BLOCK = (32 * TILES["GEMV_WARPS"],)
GEMV_GRID = ({"ceil_div": ["N", TILES["GEMV_COLS"]]},)
PAIRED_GRID = ({"ceil_div": ["N", TILES["GEMV_COLS"] // 2]},)  # a block takes pairs of W rows
# gemm.cu (wgmma, gemm_wg.cuh): prefill's entries take WG_BN W rows (or WG_BN / 2 pairs) beside
# 128 x rows a block, a producer and two consumer warpgroups; the split variants 64 x rows, one
# consumer, grid z = GEMM_SPLIT partials.
GEMM_BIG_BLOCK = (384,)
GEMM_BIG_GRID = ({"ceil_div": ["N", TILES["WG_BN"]]}, {"ceil_div": ["rows", 128]})
GEMM_BIG_PAIRED_GRID = ({"ceil_div": ["N", TILES["WG_BN"] // 2]}, {"ceil_div": ["rows", 128]})
GEMM_BLOCK = (256,)
GEMM_GRID = ({"ceil_div": ["N", TILES["WG_BN"]]}, {"ceil_div": ["rows", 64]})
GEMM_PAIRED_GRID = ({"ceil_div": ["N", TILES["WG_BN"] // 2]}, {"ceil_div": ["rows", 64]})
GEMM_SPLIT = 8  # the split variants' grid z: one block a partial (gemm_wg.cuh)


def _split(params: tuple[str, ...]) -> tuple[str, ...]:
    """A gemm kernel's parameters with the split variant's scratch and counters after its pointers."""
    n = sum(1 for p in params if "buffer" in p or "state" in p)
    return (*params[:n], buffer_param("part", "f32", "out"), buffer_param("sem", "i32", "inout"), *params[n:])
def _wg_params(gemv_params: tuple[str, ...]) -> tuple[str, ...]:
    """A gemm twin's parameters from its gemv's: a normed one reads rms_prep's x and 1/rms
    (xn, rs) in place of res and nw, and takes no eps."""
    if not gemv_params[0].startswith("res"):
        return gemv_params
    return (buffer_param("xn"), buffer_param("rs", "f32"), *(p for p in gemv_params[2:] if p != EPS))


def _wg_tiles(gemv_params: tuple[str, ...]) -> tuple[tuple[str, tuple[int, int]], ...]:
    """A gemm twin's x (or rms_prep's xn) and W, read through tensor maps in boxes of 32 rows of
    64 elements (gemm_wg.cuh's WG_BOX and WG_BK)."""
    return tuple((p.split(":")[0], (32, 64)) for p in _wg_params(gemv_params)[:3]
                 if p.split(":")[0] in ("x", "xn", "W"))


def _prep_params(gemv_params: tuple[str, ...]) -> tuple[str, ...]:
    """A normed gemm op's parameters: its gemv's, with rms_prep's outputs after the pointers."""
    n = sum(1 for p in gemv_params if "buffer" in p or "state" in p)
    return (*gemv_params[:n], buffer_param("xn", direction="out"), buffer_param("rs", "f32", "out"), *gemv_params[n:])


GEMM_TWINS = ("norm_gemv_bf16", "norm_gemv_f32", "gemv_residual", "norm_gemv_swiglu", "norm_gemv_rope_append")
HALF_HEAD = ({"ceil_div": ["head_dim", 2]},)
ROPE_GRID = ("rows", {"add": ["n_q_heads", "n_kv_heads"]})
_APPEND = ("kv_state: inout state", buffer_param("page_table", "i32"), buffer_param("cu_seqlens", "i32"), buffer_param("pos", "i32"))
_ROPE = (buffer_param("table", "f32"),)

_GEMV_KERNELS: tuple[Kernel, ...] = (
    Kernel("gemv", "norm_gemv_bf16", (buffer_param("res"), buffer_param("nw"), buffer_param("W"), buffer_param("y", direction="out"),
                                      *int_params("rows", "N", "K"), EPS), GEMV_GRID, GEMV_BLOCK, Pdl.LATE, "weights"),
    Kernel("gemv", "norm_gemv_f32", (buffer_param("res"), buffer_param("nw"), buffer_param("W"), buffer_param("y", "f32", "out"),
                                     *int_params("rows", "N", "K"), EPS), GEMV_GRID, GEMV_BLOCK, Pdl.LATE, "weights"),
    Kernel("gemv", "gemv_residual", (buffer_param("x"), buffer_param("W"), buffer_param("res", direction="inout"), *int_params("rows", "N", "K")),
           GEMV_GRID, GEMV_BLOCK, Pdl.EARLY, "weights"),
    Kernel("gemv", "norm_gemv_swiglu", (buffer_param("res"), buffer_param("nw"), buffer_param("W"), buffer_param("act", direction="out"),
                                        *int_params("rows", "N", "K"), EPS), PAIRED_GRID, GEMV_BLOCK, Pdl.LATE, "weights"),
    Kernel("gemv", "norm_gemv_rope_append", (
        buffer_param("res"), buffer_param("nw"), buffer_param("W"), buffer_param("y", direction="out"), *_APPEND, *_ROPE,
        *int_params("pages_per_seq", "rows", "n_seqs", "layer", "n_layers", "n_q_heads", "n_kv_heads", "head_dim",
               "page_tokens", "N", "K"), EPS), GEMV_GRID, GEMV_BLOCK, Pdl.LATE, "weights"),
    Kernel("gemv", "gemv_f32", (buffer_param("x"), buffer_param("W"), buffer_param("y", "f32", "out"), *int_params("rows", "N", "K")),
           GEMV_GRID, GEMV_BLOCK, Pdl.OFF, "weights"),
)
BY_GEMV = {k.entry: k for k in _GEMV_KERNELS}

KERNELS: tuple[Kernel, ...] = _GEMV_KERNELS + (
    Kernel("embed", "embed", (buffer_param("ids", "i32"), buffer_param("W"), buffer_param("x", direction="out"), *int_params("rows", "hidden")),
           ("rows",), (256,)),
    Kernel("embed", "gather_last", (buffer_param("x"), buffer_param("cu_seqlens", "i32"), buffer_param("y", direction="out"),
                                    *int_params("n_seqs", "hidden")), ("n_seqs",), (256,)),
    Kernel("norm", "rms_norm", (buffer_param("x"), buffer_param("w"), buffer_param("y", direction="out"), *int_params("rows", "hidden"), EPS),
           ("rows",), (256,)),
    Kernel("norm", "add_rms_norm", (buffer_param("res", direction="inout"), buffer_param("x"), buffer_param("w"), buffer_param("y", direction="out"),
                                    *int_params("rows", "hidden"), EPS), ("rows",), (256,)),
    Kernel("rope", "rope_table", (buffer_param("table", "f32", "out"), *int_params("max_pos", "head_dim"), "theta: f32",
                                  "factor: f32", "low_freq_factor: f32", "high_freq_factor: f32",
                                  "original_max_pos: i32"), ("max_pos",), HALF_HEAD),
    Kernel("rope", "rope", (buffer_param("q", direction="inout"), buffer_param("k", direction="inout"), buffer_param("pos", "i32"), *_ROPE,
                            *int_params("rows", "n_q_heads", "n_kv_heads", "head_dim", "q_stride", "k_stride")),
           ROPE_GRID, HALF_HEAD),
    Kernel("rope", "qk_norm_rope", (buffer_param("q", direction="inout"), buffer_param("k", direction="inout"), buffer_param("qw"), buffer_param("kw"),
                                    buffer_param("pos", "i32"), *_ROPE, *int_params("rows", "n_q_heads", "n_kv_heads", "head_dim",
                                                                       "q_stride", "k_stride"), EPS),
           ROPE_GRID, HALF_HEAD),
    Kernel("rope", "qk_norm_rope_append", (
        buffer_param("q", direction="inout"), buffer_param("k", direction="inout"), buffer_param("v"), buffer_param("qw"), buffer_param("kw"), *_APPEND, *_ROPE,
        *int_params("pages_per_seq", "rows", "n_seqs", "layer", "n_layers", "n_q_heads", "n_kv_heads", "head_dim",
               "page_tokens", "q_stride", "k_stride"), EPS), ROPE_GRID, HALF_HEAD, Pdl.LATE),
    Kernel("kv", "kv_append", (buffer_param("k"), buffer_param("v"), *_APPEND, *int_params("pages_per_seq", "rows", "n_seqs", "layer",
                                                                     "n_layers", "n_kv_heads", "head_dim",
                                                                     "page_tokens", "kv_stride")),
           ("rows", "n_kv_heads"), (32,)),
    # sem: the split counters, zero between launches (the merging block resets them), so the
    # launch leaves it as it found it and does not list it among its writes. head_groups: the
    # blocks that share a kv head's query heads (a divisor of the group; only the grid reads it).
    Kernel("attention", "attention_decode", (
        buffer_param("q"), "kv_state: in state", buffer_param("page_table", "i32"), buffer_param("pos", "i32"), buffer_param("part_o", "f32", "out"),
        buffer_param("part_ml", "f32", "out"), buffer_param("sem", "i32", "inout"), buffer_param("o", direction="out"),
        *int_params("rows", "pages_per_seq", "layer", "n_layers", "n_q_heads", "n_kv_heads", "head_dim", "page_tokens",
               "split_tokens", "q_stride")),
           ("rows", {"mul": ["n_kv_heads", "head_groups"]}, "n_splits"), (TILES["DEC_THREADS"],), Pdl.EARLY, "kv",
           writes=("part_o", "part_ml", "o")),
    Kernel("prefill_attention", "prefill_attention", (
        buffer_param("q"), "kv_state: in state", buffer_param("page_table", "i32"), buffer_param("cu_seqlens", "i32"), buffer_param("pos", "i32"),
        buffer_param("o", direction="out"), *int_params("rows", "n_seqs", "pages_per_seq", "layer", "n_layers", "n_q_heads",
                                           "n_kv_heads", "head_dim", "page_tokens", "q_stride")),
           ("n_q_heads", {"add": [{"ceil_div": ["rows", TILES["PF_BM"]]}, "n_seqs"]}), (TILES["PF_THREADS"],)),
    Kernel("mlp", "silu_mul", (buffer_param("gate_up"), buffer_param("h", direction="out"), *int_params("rows", "inter")),
           ("rows", {"ceil_div": ["inter", 8 * 256]}), (256,)),  # 8 elements a thread, any block size
    # attention_rows: a prompt's rows in attention_decode's order (attention_tc.cuh: a block a
    # query head and 64 rows of a sequence, decode's splits folded in turn): what makes prefill
    # and decode agree bit for bit.
    Kernel("attention", "attention_rows", (
        buffer_param("q"), "kv_state: in state", buffer_param("page_table", "i32"), buffer_param("cu_seqlens", "i32"), buffer_param("pos", "i32"),
        buffer_param("o", direction="out"), *int_params("rows", "n_seqs", "pages_per_seq", "layer", "n_layers", "n_q_heads",
                                           "n_kv_heads", "head_dim", "page_tokens", "split_tokens", "q_stride")),
           ("n_q_heads", {"add": [{"ceil_div": ["rows", 64]}, "n_seqs"]}), (TILES["DEC_THREADS"],)),
    # gemm.cu: the gemv projections' twins for many rows, the same bits for every row: a normed
    # one is rms_prep (x = bf16(nw * res) and 1/rms a row, the gemv's arithmetic) then the GEMM.
    Kernel("gemm", "rms_prep", (buffer_param("res"), buffer_param("nw"), buffer_param("xn", direction="out"), buffer_param("rs", "f32", "out"),
                                *int_params("rows", "K"), EPS), ("rows",), (256,)),
    *(Kernel("gemm", e.replace("gemv", "gemm"), _wg_params(BY_GEMV[e].params),
             GEMM_BIG_PAIRED_GRID if e == "norm_gemv_swiglu" else GEMM_BIG_GRID, GEMM_BIG_BLOCK,
             shared_mem=TILES["WG_BIG_SMEM"], tiles=_wg_tiles(BY_GEMV[e].params),
             writes=tuple(p.split(":")[0] for p in _wg_params(BY_GEMV[e].params) if " out " in p or " inout " in p))
      for e in GEMM_TWINS),
    # ... and split over K for the wide decode's few rows (8 blocks a tile, the last adds them
    # in order); sem: zero between launches, as attention_decode's.
    *(Kernel("gemm", e.replace("gemv", "gemm") + "_split", _split(_wg_params(BY_GEMV[e].params)),
             (*(GEMM_PAIRED_GRID if e == "norm_gemv_swiglu" else GEMM_GRID), GEMM_SPLIT), GEMM_BLOCK,
             shared_mem=TILES["WG_SPLIT_SMEM"], tiles=_wg_tiles(BY_GEMV[e].params), writes=tuple(
                 p.split(":")[0] for p in _split(_wg_params(BY_GEMV[e].params))
                 if (" out " in p or " inout " in p) and not p.startswith("sem")))
      for e in GEMM_TWINS if e != "norm_gemv_f32"),
    # mask: the step's masked rows' bitmasks (a grammar's); mask_row: each row's mask row + 1 (0: none)
    Kernel("argmax", "sample_partial", (buffer_param("logits", "f32"), buffer_param("temperature", "f32"), buffer_param("key", "i32"),
                                        buffer_param("mask", "i32"), buffer_param("mask_row", "i32"),
                                        buffer_param("part_val", "f32", "out"), buffer_param("part_idx", "i32", "out"),
                                        *int_params("vocab", "n_rows", "chunks")),
           ("chunks", "n_rows"), (256,), Pdl.LATE),
    Kernel("argmax", "argmax_final", (buffer_param("part_val", "f32"), buffer_param("part_idx", "i32"), buffer_param("tokens", "i32", "out"),
                                      *int_params("n_rows", "chunks")), ("n_rows",), (32,), Pdl.LATE),
    # a speculative round's accepted counts (the verify program's last launch): a thread a sequence
    Kernel("accept", "accept", (buffer_param("ids", "i32"), buffer_param("cu_seqlens", "i32"), buffer_param("tokens", "i32"),
                                buffer_param("accepted", "i32", "out"), *int_params("n_seqs")),
           ({"ceil_div": ["n_seqs", 32]},), (32,)),
)

BY_ENTRY = {k.entry: k for k in KERNELS}
MODULES = tuple(sorted({k.module for k in KERNELS}))


def _normed_gemm(gemv: str, gemm: str) -> Op:
    """rms_prep then the gemm twin, with the gemv's parameters plus the scratch between them
    (the split variants' part and sem after xn and rs)."""
    params = _prep_params(BY_GEMV[gemv].params)
    if gemm.endswith("_split"):
        n = params.index(buffer_param("rs", "f32", "out")) + 1
        params = (*params[:n], buffer_param("part", "f32", "out"), buffer_param("sem", "i32", "inout"), *params[n:])
    return Op(("rms_prep", gemm), params)


_ATTN = BY_ENTRY["attention_decode"].params
_SAMPLE = BY_ENTRY["sample_partial"].params
OPS = {
    "embed": Op(("embed",)), "gather_last": Op(("gather_last",)), "rms_norm": Op(("rms_norm",)),
    "add_rms_norm": Op(("add_rms_norm",)), "rope_table": Op(("rope_table",)), "rope": Op(("rope",)),
    "qk_norm_rope": Op(("qk_norm_rope",)), "qk_norm_rope_append": Op(("qk_norm_rope_append",)),
    "kv_append": Op(("kv_append",)),
    "attention_decode": Op(("attention_decode",), (*_ATTN, "n_splits: i32", "head_groups: i32")),
    "attention_prefill": Op(("prefill_attention",)), "silu_mul": Op(("silu_mul",)),
    "norm_gemv": Op(("norm_gemv_bf16",)), "norm_gemv_logits": Op(("norm_gemv_f32",)),
    "gemv_residual": Op(("gemv_residual",)), "norm_gemv_swiglu": Op(("norm_gemv_swiglu",)),
    "norm_gemv_rope_append": Op(("norm_gemv_rope_append",)), "gemv_logits": Op(("gemv_f32",)),
    **{op: _normed_gemm(gemv, gemm) for op, gemv, gemm in (
        ("norm_gemm", "norm_gemv_bf16", "norm_gemm_bf16"), ("norm_gemm_logits", "norm_gemv_f32", "norm_gemm_f32"),
        ("norm_gemm_swiglu", "norm_gemv_swiglu", "norm_gemm_swiglu"),
        ("norm_gemm_rope_append", "norm_gemv_rope_append", "norm_gemm_rope_append"),
        ("norm_gemm_split", "norm_gemv_bf16", "norm_gemm_bf16_split"),
        ("norm_gemm_swiglu_split", "norm_gemv_swiglu", "norm_gemm_swiglu_split"),
        ("norm_gemm_rope_append_split", "norm_gemv_rope_append", "norm_gemm_rope_append_split"))},
    "gemm_residual": Op(("gemm_residual",)), "attention_rows": Op(("attention_rows",)),
    "gemm_residual_split": Op(("gemm_residual_split",)),
    "sample": Op(("sample_partial", "argmax_final"), (*_SAMPLE[:7], buffer_param("tokens", "i32", "out"), *_SAMPLE[7:])),
    "accept": Op(("accept",)),
}
# Not kernels here: the prefill and wide decode projections go through cuBLASLt (kern.runtime's extern call).
EXTERN_OPS = {
    "gemm": {"params": [buffer_param("x"), buffer_param("W"), buffer_param("y", direction="out"), "M: i32", "N: i32", "K: i32"],
             "impl": {"launches": [{"entry": "extern:cublaslt_bf16_tn"}]}},
    "gemm_logits": {"params": [buffer_param("x"), buffer_param("W"), buffer_param("y", "f32", "out"), "M: i32", "N: i32", "K: i32"],
                    "impl": {"launches": [{"entry": "extern:cublaslt_bf16_tn_f32"}]}},
}


def ops() -> dict:
    """Every op the generator may emit, as manifest JSON."""
    return {**{name: op.to_manifest(BY_ENTRY) for name, op in OPS.items()}, **EXTERN_OPS}
