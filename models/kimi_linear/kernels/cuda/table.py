"""The Kimi-Linear CUDA kernels (kda.cu, kda_tc.cu, mla.cu, mla_tc.cu, route.cu, linear.cu), one typed table in the
llama family's form (kern_models.llama.kernels.cuda.table: Kernel, Op). None launches under
programmatic dependent launch: each starts when the kernel before it is done.

The op names and their buffer parameters are the cpu manifest's (manifests/cpu.py), so kern
test pairs each call with the reference's call of the same op over the same buffers and a
bug in one kernel fails in that kernel's span."""

from __future__ import annotations

from kern_models.common.kernel_table import ARCH, Kernel, Op, buffer_param, int_params
from kern_models.llama.kernels.cuda import table as dense

# linear.cu runs llama's gemv.cuh and gemm_wg.cuh (their k order is the one every row keeps), so
# nvcc gets the llama constants they read; every other size below is a kernel's own #define or a
# parameter.
TILES = {k: dense.TILES[k] for k in ("GEMV_WARPS", "GEMV_COLS", "WG_BN", "WG_BIG_SMEM", "WG_SPLIT_SMEM",
                                      "WG_SPLIT_PART")}
CHUNK_THREADS = 256  # kda_chunked's block; a chunk is at most this many rows (its substitution: a thread a column)
MAX_DIM = 128        # kda.cu KDA_MAX_DIM (and kda_tc.cu KDA_TC_MAX_DIM)
# kda_tc.cu: chunks of KDA_TC_C positions (one m16 tile of rows, one k16 step over them), a block
# of KDA_TC_THREADS a group of KDA_TC_DV value columns; the rows a sequence keeps inside a chunk:
# k, gc and v', [C, dim] f32 each
KDA_TC_C, KDA_TC_THREADS, KDA_TC_ROWS, KDA_TC_DV = 16, 256, 3, 32
MAX_CONV = 8         # kda_conv.cuh KDA_MAX_CONV
MAX_EXPERTS = 512    # route.cu ROUTE_MAX_EXPERTS
MAX_GROUPS = 32      # route.cu ROUTE_MAX_GROUPS
MAX_LATENT = 576     # mla.cu MLA_MAX_W (kv_lora + rope)
MAX_LORA = 512       # mla.cu MLA_MAX_LORA
MAX_NOPE = 256       # mla_absorb's query tile
MLA_ROWS, MLA_HEADS = 16, 8  # mla.cu MLA_ROWS, MLA_HEADS
# mla_tc.cu: a block a row's 16 heads a group of 4 warps, prefill 2 groups (the key tiles shared
# by 32 heads), decode 1 (twice the blocks for a step's few rows); its dynamic shared memory
# MLA_TC_SMEM(groups): two stages of 32 keys x (576 + 8) bf16 and a group's partial scores (8 KiB)
MLA_TC_HEADS = {"mla_attend_tc": 32, "mla_attend_tc_decode": 16}
MLA_TC_BN, MLA_TC_KP = 32, 576 + 8  # mla_tc.cu MLA_BN, MLA_KP
MLA_TC_PART = 4 * (MLA_TC_BN // 8) * 4 * 32 * 4  # MLA_PART in bytes: 4 warps' C fragments of S
MLA_TC_SMEM = {e: 2 * MLA_TC_BN * MLA_TC_KP * 2 + n // 16 * MLA_TC_PART for e, n in MLA_TC_HEADS.items()}
# mla_tc.cu's up-projections (mla_absorb_tc, mla_expand_tc): a block 64 rows x 128 (absorb) or
# 64 (expand) columns of a head, kv_b's slice staged 64 k at a time; dynamic shared memory the
# larger staging (absorb's 64 key rows x (128 + 8) bf16)
MLA_PT_BM, MLA_PT_BN, MLA_PT_EBN, MLA_PT_SMEM = 64, 128, 64, 64 * (128 + 8) * 2
# mla_tc.cu's split: a row's keys in chunks of `chunk` from key 0 (a multiple of MLA_TC_BN; the
# deployment's constant, manifests/cuda.py MLA_CHUNK), folded in order; decode a block a chunk
# (grid z: `splits`, at least the step's longest context's chunks), its partials in part_o
# [rows, heads, splits, kv_lora] and part_ml [rows, heads, splits, 2] (f32), sem [rows, heads]
# (i32, zero between launches) counting a (row, head group)'s finished blocks

# mla_tc.cu's expanded form (a prompt's rows): a block 64 rows of one head (4 warps x 16), q K^T
# over nope + rope channels (at most MLA_X_MAX_QK, a multiple of 16; nope a multiple of 8) and
# v_dim values (at most MLA_X_MAX_V, a multiple of 8); mla_keys' block a thread a sequence
MLA_X_BM, MLA_X_MAX_QK, MLA_X_MAX_V, MLA_X_KEYS_THREADS = 64, 192, 128, 256
MLA_X_SMEM = 2 * 32 * (MLA_X_MAX_QK + 8 + MLA_X_MAX_V + 8) * 2 + 16  # mla_tc.cu MLA_X_SMEM: two stages of 32 keys' K and V, 4 ints
# its wgmma twin mla_attend_x_wg (the default build's: the same bits, 2.0-2.2x faster on the H100,
# docs/perf.md; mla_attend_x stays as the order's mma.sync reference its tests compare to): a block
# 128 prompt rows of one head, two consumer warpgroups and a producer one (384 threads); dynamic
# shared memory MLA_XW_SMEM: three stages of 64 keys' K (3 x 64 channels) and V (2 x 64 dims),
# 128-byte rows, the 1024-byte alignment, six mbarriers, 8 ints
MLA_XW_BM, MLA_XW_THREADS = 128, 384
MLA_XW_SMEM = 3 * 64 * 128 * (MLA_X_MAX_QK // 64 + MLA_X_MAX_V // 64) + 1024 + 2 * 3 * 8 + 32

_KDA = ("layer: i32", "layers: i32", "heads: i32", "dim: i32", "conv: i32", "slot_bytes: i32")
_STATE = "state: inout state"
_CONV_GRID = {"ceil_div": [{"mul": [3, "heads", "dim"]}, 128]}
# kda_chunked's dynamic shared memory (f32): S [dim, dim], six [chunk, dim] tiles, two
# [chunk, chunk + 1] and beta [chunk]
_CHUNK_SMEM = {"mul": [4, {"add": [{"mul": ["dim", {"add": ["dim", {"mul": [6, "chunk"]}]}]},
                                   {"mul": ["chunk", {"add": [{"mul": [2, "chunk"]}, 3]}]}]}]}
# kda_tc's dynamic shared memory (f32), VS = DV + 4: S [dim, VS] (a group's columns), X [2C, dim + 4],
# XS [2C, VS], k gc [C, dim], v v' [C, VS], A and P [C, C + 1], beta [C], decay [dim]:
# dim (VS + 4C + 1) + 2C^2 + 11C + 4C VS; then the staging area the next chunk's rows land in
# (kda_tc.cu TcStage): k bf16 [C, dim], g [C, dim], v bf16 [C, DV], kda_tc_prep's rows
# [C, 2C + 2 dim]: dim 7C/2 + C DV / 2 + 2C^2 (95,424 bytes at dim 128: two blocks an SM, as
# the registers allow)
_TC_VS = KDA_TC_DV + 4
_TC_SMEM = {"mul": [4, {"add": [{"mul": ["dim", _TC_VS + 4 * KDA_TC_C + 1 + 7 * KDA_TC_C // 2]},
                                2 * KDA_TC_C ** 2 + 11 * KDA_TC_C + 4 * KDA_TC_C * _TC_VS
                                + KDA_TC_C * KDA_TC_DV // 2 + 2 * KDA_TC_C ** 2]}]}
# kda_tc's grid z: groups of 16 value columns, a step of one sequence's (kda_tc.cu tc_cols: more
# sequences take 32 a group, the upper half of the groups returning at once)
_TC_GROUPS = {"ceil_div": ["dim", KDA_TC_DV // 2]}
# kda_tc_prep's (a block a (row, head)): the chunk's rows' k and gc [C][dim] and the row's q
_TC_PREP_SMEM = {"mul": [4 * (2 * KDA_TC_C + 1), "dim"]}
_TC_PREP_THREADS = 128  # kda_tc.cu kda_tc_prep's __launch_bounds__
# kda_tc_decode's (a block a (row, head), all value columns): K G [C][dim], X VN [C][dim + 4], seven
# [dim] rows, A P [C], beta
_TC_DEC_SMEM = {"mul": [4, {"add": [{"mul": ["dim", 4 * KDA_TC_C + 7]}, 10 * KDA_TC_C + 1]}]}
_MLA = ("heads: i32", "nope: i32", "rope: i32", "kv_lora: i32", "page_tokens: i32", "token_bytes: i32")
_APPEND = ("layer: i32", "layers: i32", "kv_lora: i32", "rope: i32", "page_tokens: i32", "token_bytes: i32",
           "eps: f32")
_KV = "kv: inout state"
# mla_attend_x's parameters (and its wgmma twin's)
_ATTEND_X = (buffer_param("q"), "kv: in state", buffer_param("page_table", "i32"), buffer_param("cu_seqlens", "i32"),
             buffer_param("pos", "i32"), buffer_param("prompt_len", "i32"), buffer_param("koff", "i32"), buffer_param("kx"),
             buffer_param("o", direction="out"),
             *int_params("pages_per_seq", "rows", "n_seqs", "keys", "layer", "layers", "heads", "nope", "rope", "kv_lora",
                         "v_dim", "page_tokens", "token_bytes"))
_LINEAR = (buffer_param("x"), buffer_param("W"), buffer_param("y", direction="out"), *int_params("rows", "N", "K"))

KERNELS: tuple[Kernel, ...] = (
    Kernel("kda", "kda_conv", (buffer_param("mix", direction="inout"), buffer_param("w"), _STATE, buffer_param("slot", "i32"),
                               buffer_param("cu_seqlens", "i32"), buffer_param("pos", "i32"), *int_params("n_seqs"), *_KDA),
           ("n_seqs", _CONV_GRID), (128,)),
    Kernel("kda", "kda_conv_decode", (buffer_param("mix", direction="inout"), buffer_param("w"), _STATE, buffer_param("slot", "i32"),
                                      buffer_param("pos", "i32"), *int_params("rows"), *_KDA), ("rows", _CONV_GRID), (128,)),
    Kernel("kda", "kda_gate", (buffer_param("f", "f32", "inout"), buffer_param("a_log"), buffer_param("dt_bias"), *int_params("rows", "heads", "dim")),
           ("rows", {"ceil_div": [{"mul": ["heads", "dim"]}, 256]}), (256,)),
    Kernel("kda", "kda_chunked", (buffer_param("mix"), buffer_param("g", "f32"), buffer_param("b", "f32"), _STATE, buffer_param("slot", "i32"),
                                  buffer_param("cu_seqlens", "i32"), buffer_param("pos", "i32"), buffer_param("o", direction="out"),
                                  *int_params("n_seqs"), *_KDA, "chunk: i32"), ("n_seqs", "heads"), (CHUNK_THREADS,)),
    Kernel("kda", "kda_tokens", (buffer_param("mix"), buffer_param("g", "f32"), buffer_param("b", "f32"), _STATE, buffer_param("slot", "i32"),
                                 buffer_param("cu_seqlens", "i32"), buffer_param("pos", "i32"), buffer_param("o", direction="out"),
                                 *int_params("n_seqs"), *_KDA), ("n_seqs", "heads"), (MAX_DIM,)),
    Kernel("kda", "kda_step", (buffer_param("mix"), buffer_param("g", "f32"), buffer_param("b", "f32"), _STATE, buffer_param("slot", "i32"),
                               buffer_param("pos", "i32"), buffer_param("o", direction="out"), *int_params("rows"), *_KDA),
           ("rows", "heads"), (MAX_DIM,)),
    # the default build's recurrence (kda_tc.cu): chunks fixed by position on tensor cores, prefill
    # and decode one routine; kda_tokens' and kda_step's parameters
    # prefill's rows' scores and left operands, every row at once (`pre`: [rows, heads, 2 C + 2 dim] f32)
    Kernel("kda_tc", "kda_tc_prep", (buffer_param("mix"), buffer_param("g", "f32"), "state: in state", buffer_param("slot", "i32"),
                                     buffer_param("cu_seqlens", "i32"), buffer_param("pos", "i32"), buffer_param("pre", "f32", "out"),
                                     *int_params("rows", "n_seqs"), *_KDA), ("rows", "heads"), (_TC_PREP_THREADS,), writes=("pre",)),
    Kernel("kda_tc", "kda_tc_head", (buffer_param("mix"), buffer_param("g", "f32"), buffer_param("b", "f32"), _STATE,
                                     buffer_param("slot", "i32"), buffer_param("cu_seqlens", "i32"), buffer_param("pos", "i32"),
                                     buffer_param("pre", "f32"), buffer_param("o", direction="out"), *int_params("n_seqs"), *_KDA),
           ("n_seqs", "heads", _TC_GROUPS), (KDA_TC_THREADS,)),
    Kernel("kda_tc", "kda_tc", (buffer_param("mix"), buffer_param("g", "f32"), buffer_param("b", "f32"), _STATE, buffer_param("slot", "i32"),
                                buffer_param("cu_seqlens", "i32"), buffer_param("pos", "i32"), buffer_param("pre", "f32"),
                                buffer_param("o", direction="out"), *int_params("n_seqs"), *_KDA), ("n_seqs", "heads", _TC_GROUPS),
           (KDA_TC_THREADS,)),
    Kernel("kda_tc", "kda_tc_decode", (buffer_param("mix"), buffer_param("g", "f32"), buffer_param("b", "f32"), _STATE,
                                       buffer_param("slot", "i32"), buffer_param("pos", "i32"), buffer_param("o", direction="out"),
                                       *int_params("rows"), *_KDA), ("rows", "heads"), (KDA_TC_THREADS,)),
    Kernel("kda", "kda_out_norm", (buffer_param("o"), buffer_param("gate"), buffer_param("w"), buffer_param("y", direction="out"),
                                   *int_params("rows", "heads", "dim"), "eps: f32"), ("rows", "heads"), (32,)),
    Kernel("mla", "mla_append", (buffer_param("ckv"), buffer_param("norm_w"), _KV, buffer_param("page_table", "i32"), buffer_param("cu_seqlens", "i32"),
                                 buffer_param("pos", "i32"), *int_params("pages_per_seq", "rows", "n_seqs"), *_APPEND),
           ("rows",), (128,)),
    Kernel("mla", "mla_append_decode", (buffer_param("ckv"), buffer_param("norm_w"), _KV, buffer_param("page_table", "i32"),
                                        buffer_param("pos", "i32"), *int_params("pages_per_seq", "rows"), *_APPEND),
           ("rows",), (128,)),
    Kernel("mla", "mla_absorb", (buffer_param("q"), buffer_param("kv_b"), buffer_param("q_lat", "f32", "out"),
                                 *int_params("rows", "heads", "nope", "rope", "v_dim", "kv_lora")),
           ({"ceil_div": ["rows", MLA_ROWS]}, "heads", {"ceil_div": ["kv_lora", 128]}), (128,)),
    Kernel("mla", "mla_attend", (buffer_param("q_lat", "f32"), buffer_param("q"), "kv: in state", buffer_param("page_table", "i32"),
                                 buffer_param("cu_seqlens", "i32"), buffer_param("pos", "i32"), buffer_param("o_lat", "f32", "out"),
                                 *int_params("pages_per_seq", "rows", "n_seqs", "layer", "layers"), *_MLA),
           ("rows", {"ceil_div": ["heads", MLA_HEADS]}), (32 * MLA_HEADS,)),
    Kernel("mla", "mla_attend_decode", (buffer_param("q_lat", "f32"), buffer_param("q"), "kv: in state", buffer_param("page_table", "i32"),
                                        buffer_param("pos", "i32"), buffer_param("o_lat", "f32", "out"),
                                        *int_params("pages_per_seq", "rows", "layer", "layers"), *_MLA),
           ("rows", {"ceil_div": ["heads", MLA_HEADS]}), (32 * MLA_HEADS,)),
    # the same attention on tensor cores (mla_tc.cu), the default build's: the same parameters
    Kernel("mla_tc", "mla_attend_tc", (buffer_param("q_lat", "f32"), buffer_param("q"), "kv: in state", buffer_param("page_table", "i32"),
                                       buffer_param("cu_seqlens", "i32"), buffer_param("pos", "i32"), buffer_param("prompt_len", "i32"),
                                       buffer_param("o_lat", "f32", "out"),
                                       *int_params("pages_per_seq", "rows", "n_seqs", "layer", "layers"), *_MLA, "chunk: i32"),
           ("rows", {"ceil_div": ["heads", MLA_TC_HEADS["mla_attend_tc"]]}), (8 * MLA_TC_HEADS["mla_attend_tc"],),
           shared_mem=MLA_TC_SMEM["mla_attend_tc"]),
    Kernel("mla_tc", "mla_attend_tc_decode", (buffer_param("q_lat", "f32"), buffer_param("q"), "kv: in state", buffer_param("page_table", "i32"),
                                              buffer_param("pos", "i32"), buffer_param("o_lat", "f32", "out"),
                                              buffer_param("part_o", "f32", "out"), buffer_param("part_ml", "f32", "out"),
                                              buffer_param("sem", "i32", "inout"),
                                              *int_params("pages_per_seq", "rows", "layer", "layers"), *_MLA, "chunk: i32",
                                              "splits: i32"),
           ("rows", {"ceil_div": ["heads", MLA_TC_HEADS["mla_attend_tc_decode"]]}, "splits"),
           (8 * MLA_TC_HEADS["mla_attend_tc_decode"],),
           writes=("o_lat", "part_o", "part_ml"),  # sem: zero between launches, as llama's attention_decode's
           shared_mem=MLA_TC_SMEM["mla_attend_tc_decode"]),
    Kernel("mla", "mla_expand", (buffer_param("o_lat", "f32"), buffer_param("kv_b"), buffer_param("o", direction="out"),
                                 *int_params("rows", "heads", "nope", "v_dim", "kv_lora")),
           ({"ceil_div": ["rows", MLA_ROWS]}, "heads"), (256,)),
    # the same projections on tensor cores (mla_tc.cu), the default build's: the same parameters
    Kernel("mla_tc", "mla_absorb_tc", (buffer_param("q"), buffer_param("kv_b"), buffer_param("q_lat", "f32", "out"),
                                       *int_params("rows", "heads", "nope", "rope", "v_dim", "kv_lora")),
           ({"ceil_div": ["rows", MLA_PT_BM]}, "heads", {"ceil_div": ["kv_lora", MLA_PT_BN]}), (128,),
           shared_mem=MLA_PT_SMEM),
    Kernel("mla_tc", "mla_expand_tc", (buffer_param("o_lat", "f32"), buffer_param("kv_b"), buffer_param("o", direction="out"),
                                       *int_params("rows", "heads", "nope", "v_dim", "kv_lora")),
           ({"ceil_div": ["rows", MLA_PT_BM]}, "heads", {"ceil_div": ["v_dim", MLA_PT_EBN]}), (128,),
           shared_mem=MLA_PT_SMEM),
    # the expanded form of a prompt's rows (mla_tc.cu): the keys a step's sequences need numbered
    # (koff), their latents gathered (lat, the expansion GEMM's x), the attention over kx
    Kernel("mla_tc", "mla_keys", (buffer_param("cu_seqlens", "i32"), buffer_param("pos", "i32"), buffer_param("prompt_len", "i32"),
                                  buffer_param("koff", "i32", "out"), *int_params("n_seqs")), (1,), (MLA_X_KEYS_THREADS,),
           writes=("koff",), shared_mem=4 * MLA_X_KEYS_THREADS),
    Kernel("mla_tc", "mla_gather", ("kv: in state", buffer_param("page_table", "i32"), buffer_param("koff", "i32"),
                                    buffer_param("lat", direction="out"),
                                    *int_params("pages_per_seq", "n_seqs", "keys", "layer", "layers", "kv_lora", "rope",
                                                "page_tokens", "token_bytes")), ("keys",), (64,), writes=("lat",)),
    Kernel("mla_tc", "mla_attend_x", _ATTEND_X, ("heads", {"add": [{"ceil_div": ["rows", MLA_X_BM]}, "n_seqs"]}), (128,),
           shared_mem=MLA_X_SMEM),
    Kernel("mla_tc", "mla_attend_x_wg", _ATTEND_X, ("heads", {"add": [{"ceil_div": ["rows", MLA_XW_BM]}, "n_seqs"]}),
           (MLA_XW_THREADS,), shared_mem=MLA_XW_SMEM),
    Kernel("route", "kimi_route", (buffer_param("logits", "f32"), buffer_param("bias"), buffer_param("ids", "i32", "out"),
                                   buffer_param("weights", "f32", "out"), *int_params("rows", "experts", "top_k"), "scaling: f32",
                                   *int_params("norm_topk", "groups", "topk_groups")), ("rows",), (32,)),
    Kernel("route", "add", (buffer_param("x", direction="inout"), buffer_param("y"), *int_params("rows", "hidden")),
           ("rows", {"ceil_div": ["hidden", 256]}), (256,)),
    Kernel("route", "zero", (buffer_param("x", direction="out"), *int_params("rows", "hidden")),
           ("rows", {"ceil_div": ["hidden", 256]}), (256,)),
    # the batch-invariant build's bf16 projections: llama's gemv (decode) and its wgmma twin's
    # prefill shape (x and W through tensor maps), one k order
    Kernel("linear", "linear_gemv", _LINEAR, dense.GEMV_GRID, dense.GEMV_BLOCK),
    Kernel("linear", "linear_gemm", _LINEAR, dense.GEMM_BIG_GRID, dense.GEMM_BIG_BLOCK,
           shared_mem=dense.TILES["WG_BIG_SMEM"], tiles=(("x", (32, 64)), ("W", (32, 64)))),
    # the wide decode's few rows of a projection with few column tiles: K over 8 blocks a tile
    Kernel("linear", "linear_gemm_split", dense._split(_LINEAR), (*dense.GEMM_GRID, dense.GEMM_SPLIT), dense.GEMM_BLOCK,
           shared_mem=dense.TILES["WG_SPLIT_SMEM"], tiles=(("x", (32, 64)), ("W", (32, 64))), writes=("y", "part")),
)
BY_ENTRY = {k.entry: k for k in KERNELS}
MODULES = tuple(sorted({k.module for k in KERNELS}))
SHARED_MEM = {"kda_chunked": _CHUNK_SMEM, "kda_tc_prep": _TC_PREP_SMEM, "kda_tc_head": _TC_SMEM, "kda_tc": _TC_SMEM, "kda_tc_decode": _TC_DEC_SMEM}

_ABSORB, _EXPAND = BY_ENTRY["mla_absorb"].params, BY_ENTRY["mla_expand"].params


def _attention(attend: str, absorb: str = "mla_absorb", expand: str = "mla_expand") -> Op:
    """MLA attention as three launches: absorb kv_b's key half into the query, attend over the
    latents, expand through its value half. The op's parameters: the cpu op's buffers in its
    order, then the two f32 workspaces, the attend kernel's own scratch (decode's split
    partials and counters, mla_attend_tc_decode) and the sizes."""
    a = BY_ENTRY[attend].params
    table = [p for p in a if p.startswith(("page_table", "cu_seqlens", "pos", "prompt_len"))]
    scratch = [p for p in a if p.startswith(("part_o", "part_ml", "sem"))]
    ints = [p for p in a if p.endswith("i32")]
    return Op((absorb, attend, expand), (
        buffer_param("q"), "kv: in state", *table, buffer_param("kv_b"), buffer_param("o", direction="out"), buffer_param("q_lat", "f32", "out"),
        buffer_param("o_lat", "f32", "out"), *scratch, *ints, "v_dim: i32"))


def _attention_roles() -> Op:
    """The default build's prefill MLA: the absorbed form's three launches for the generated
    rows (mla_attend_tc skips a prompt row), then mla_attend_x_wg (wgmma; mla_attend_x's bits)
    over the expanded keys (koff, kx: the mla_gather op and the expansion GEMM before it) writes
    the prompt rows' o."""
    return Op(("mla_absorb_tc", "mla_attend_tc", "mla_expand_tc", "mla_attend_x_wg"), (
        buffer_param("q"), "kv: in state", buffer_param("page_table", "i32"), buffer_param("cu_seqlens", "i32"),
        buffer_param("pos", "i32"), buffer_param("prompt_len", "i32"), buffer_param("kv_b"), buffer_param("o", direction="out"),
        buffer_param("q_lat", "f32", "out"), buffer_param("o_lat", "f32", "out"), buffer_param("koff", "i32"), buffer_param("kx"),
        *int_params("pages_per_seq", "rows", "n_seqs", "keys", "layer", "layers", "heads", "nope", "rope", "kv_lora",
                    "page_tokens", "token_bytes", "chunk", "v_dim")))


OPS = {
    **{e: Op((e,)) for e in ("kda_conv", "kda_conv_decode", "kda_gate", "kda_chunked", "kda_step", "kda_out_norm",
                             "mla_append", "mla_append_decode", "kimi_route", "add", "zero")},
    "mla_attention": _attention("mla_attend"), "mla_attention_decode": _attention("mla_attend_decode"),  # ops(): mla_form's
    # the batch-invariant build's projections: decode's rows, prefill's and the wide decode's
    "linear": Op(("linear_gemv",)), "linear_rows": Op(("linear_gemm",)), "linear_rows_split": Op(("linear_gemm_split",)),
}


# The prompt's recurrence: "chunked" (16-row chunks from the prompt's first row, faster on long
# prompts, its bits depend on where the prompt was cut), "tokens" (a token at a time through
# decode's step: the same bits cut anywhere or decoded) or "tc" (kda_tc.cu: chunks of KDA_TC_C
# fixed by position on tensor cores, decode computing its token as a row of its chunk: the same
# bits cut anywhere or decoded; its decode is kda_tc_decode and its slot keeps the chunk's rows).
# Each is the op kda_chunked (and kda_step), which kern test pairs with the cpu reference's op of
# that name.
KDA_FORMS = ("chunked", "tokens", "tc")
# MLA's attention: "tensor" (mla_tc.cu, mma.sync, the up-projections too; the default build's)
# or "cores" (mla.cu's mla_absorb, mla_attend and mla_expand, CUDA cores; the faster build keeps
# them until the tensor-core ones are measured on the H200). Both are the ops mla_attention /
# mla_attention_decode, each row-wise: a prompt row gets the bits the same token gets decoded in
# either form (not across forms). A form: (prefill's attend, decode's attend, absorb, expand).
MLA_FORMS = {"tensor": ("mla_attend_tc", "mla_attend_tc_decode", "mla_absorb_tc", "mla_expand_tc"),
             "cores": ("mla_attend", "mla_attend_decode", "mla_absorb", "mla_expand")}


# the tc form's prefill op: kda_tc's parameters with its scores' workspace and the step's rows
_TC_PREFILL = (*BY_ENTRY["kda_tc"].params[:7], buffer_param("pre", "f32", "out"), *BY_ENTRY["kda_tc"].params[8:9], "rows: i32",
               *BY_ENTRY["kda_tc"].params[9:])


def ops(kda_form: str = "chunked", mla_form: str = "tensor") -> dict:
    """Every op the generator may emit, as manifest JSON, the prompt's recurrence in kda_form,
    MLA's attention in mla_form."""
    prefill, decode, absorb, expand = MLA_FORMS[mla_form]
    # the tc form's prefill: the first chunk's rows a sequence continues (kda_tc_head), then the rest
    prefill_kda = Op(("kda_tc_prep", "kda_tc_head", "kda_tc"), _TC_PREFILL) if kda_form == "tc" else Op(("kda_" + kda_form,))
    table = {**OPS, "kda_chunked": prefill_kda, "kda_step": Op(("kda_tc_decode" if kda_form == "tc" else "kda_step",)),
             "mla_attention": _attention_roles() if mla_form == "tensor" else _attention(prefill, absorb, expand),
             "mla_attention_decode": _attention(decode, absorb, expand),
             "mla_gather": Op(("mla_keys", "mla_gather"), (
                 buffer_param("cu_seqlens", "i32"), buffer_param("pos", "i32"), buffer_param("prompt_len", "i32"), "kv: in state",
                 buffer_param("page_table", "i32"), buffer_param("koff", "i32", "out"), buffer_param("lat", direction="out"),
                 *int_params("pages_per_seq", "n_seqs", "keys", "layer", "layers", "kv_lora", "rope", "page_tokens",
                             "token_bytes")))}
    out = {name: op.to_manifest(BY_ENTRY) for name, op in table.items()}
    for op in out.values():
        for launch in op["impl"]["launches"]:
            if launch["entry"] in SHARED_MEM:
                launch["shared_mem"] = SHARED_MEM[launch["entry"]]
    return out


__all__ = ["ARCH", "KDA_FORMS", "MLA_FORMS", "KERNELS", "MODULES", "TILES", "ops"]
