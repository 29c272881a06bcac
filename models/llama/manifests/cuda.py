"""The llama family's manifest for cuda sm_90a: bf16 buffers, the kernels of cuda/table.py
(what each computes: cuda/KERNELS.md), cuBLASLt for prefill projections, CUDA graphs for decode.

Decode launches after the first carry the PDL attribute (programmatic dependent launch) as the
table says; the order of the calls below is what keeps the early triggers safe (cuda/common.cuh;
tests/cuda/test_cuda_pdl_order.py).

Buffer and program names match the cpu manifest (manifest_cpu.py), so kern test can judge this
manifest span by span against the cpu reference of the same model."""

from __future__ import annotations

from ..config import ConfigError, Shape
from ..kernels.cuda import table
from kern_models.common.manifest_parts import MASK_ROWS, MAX_STEP_TOKENS, buffer, buffer_arg, context_of, program_batch, sampling_args, sampling_inputs, tokens_of, value_arg

from .common import PAGE_TOKENS, weight_buffers

BF = "bf16"
# Context split of decode attention: a sequence's context is spread over blocks of one tile
# each (128 tokens at head_dim 64: a context that fits is one pass with no merge).
DECODE_SPLIT = 128
ARGMAX_CHUNKS = 128
# The graph-captured decode program steps at most this many sequences: the gemv kernels read
# each weight once for up to 32 rows (more go in passes that re-read it). Larger batches (a
# server's, up to PREFILL_SEQS) step through the prefill program: ragged rows, one row each.
DECODE_SEQS = 32
# The gemv decode program's default bound: past it the wide program's GEMMs are faster than
# the gemv kernels (bench/crossover.py; the crossover's figures: docs/perf-history.md).
GEMV_SEQS = 8
PREFILL_SEQS = 256
# The wide decode program steps 33 to WIDE_SEQS sequences, one row each, as a CUDA graph of
# cuBLASLt GEMMs: each weight is read once a step however many rows there are (the gemv
# kernels re-read it every 32 rows), which is what a server's large batches need.
WIDE_SEQS = 256
# The longest context the generator offers: the model's own max_position_embeddings, clipped to
# this (the decode partials and the rope table grow with it; longer is untested).
MAX_CONTEXT = 32768
# Query heads a decode attention block serves at most, by program: a kv head's group of G heads
# is split over the fewest blocks that leave each a whole number of at most this many. The
# block's heads are the rows of its mma, so more heads a block cost little more a block and
# launch fewer blocks: at 1 row one head a block is fastest, past a few rows the whole group
# (the timings: kernels/cuda/KERNELS.md). The bits do not change.
DECODE_GROUP_HEADS = 1
WIDE_GROUP_HEADS = 8
# The verify program (speculative rounds, docs/speculative.md; invariant builds only): at most
# this many sequences and rows a round. A lone stream's round is its last token and up to k
# proposed ones; the bounds also hold kern test's rounds (3 rows for each of up to 32 sequences).
VERIFY_SEQS = 32
VERIFY_ROWS = 128


def head_groups(s: Shape, heads_a_block: int) -> int:
    """The blocks that share one kv head's query heads in decode attention."""
    g = s.heads // s.kv_heads
    return next(d for d in range(1, g + 1) if g % d == 0 and g // d <= heads_a_block)


def _qkv_slices(p: str):
    q = {"buf": p + "qkv"}
    k = {"buf": p + "qkv", "offset": "q_dim"}
    vv = {"buf": p + "qkv", "offset": {"add": ["q_dim", "kv_dim"]}}
    return q, k, vv


def _gemm_layers(s: Shape, p: str, rows: str, seqs: str, pages, attention) -> list:
    """The embedding, every layer as one op a step (cuBLASLt GEMMs for the projections) and
    the final norm into `h`; `attention(l)` is layer l's attention call. Prefill's and the
    wide decode's programs share it."""
    q, k, vv = _qkv_slices(p)
    lin = lambda x, w, y, n, kk: {"op": "gemm", "args": [buffer_arg(x), buffer_arg(w), buffer_arg(y), value_arg(rows), value_arg(n), value_arg(kk)]}
    calls = [{"op": "embed", "args": [buffer_arg(p + "ids"), buffer_arg("embed"), buffer_arg(p + "x"), value_arg(rows), value_arg("hidden")]}]
    for l in range(s.layers):
        if l == 0:
            calls.append({"op": "rms_norm", "args": [buffer_arg(p + "x"), buffer_arg("ln1.0"), buffer_arg(p + "h"), value_arg(rows), value_arg("hidden"),
                                                     value_arg(s.eps)]})
        else:
            calls.append({"op": "add_rms_norm", "args": [buffer_arg(p + "x"), buffer_arg(p + "mlp_out"), buffer_arg(f"ln1.{l}"),
                                                         buffer_arg(p + "h"), value_arg(rows), value_arg("hidden"), value_arg(s.eps)]})
        calls.append(lin(p + "h", f"qkv_w.{l}", p + "qkv", "qkv_dim", "hidden"))
        if s.qk_norm:
            calls.append({"op": "qk_norm_rope", "args": [q, k, buffer_arg(f"q_norm.{l}"), buffer_arg(f"k_norm.{l}"), buffer_arg(p + "pos"),
                          buffer_arg("rope"), value_arg(rows), value_arg("heads"), value_arg("kv_heads"), value_arg("head_dim"), value_arg("qkv_dim"),
                          value_arg("qkv_dim"), value_arg(s.eps)]})
        else:
            calls.append({"op": "rope", "args": [q, k, buffer_arg(p + "pos"), buffer_arg("rope"), value_arg(rows), value_arg("heads"),
                                                 value_arg("kv_heads"), value_arg("head_dim"), value_arg("qkv_dim"), value_arg("qkv_dim")]})
        calls.append({"op": "kv_append", "args": [k, vv, {"state": "kv"}, buffer_arg(p + "page_table"),
                      buffer_arg(p + "cu_seqlens"), buffer_arg(p + "pos"), value_arg(pages), value_arg(rows), value_arg(seqs), value_arg(l), value_arg("layers"),
                      value_arg("kv_heads"), value_arg("head_dim"), value_arg("page_tokens"), value_arg("qkv_dim")]})
        calls.append(attention(l))
        calls.append(lin(p + "attn", f"o_w.{l}", p + "attn_out", "hidden", "q_dim"))
        calls.append({"op": "add_rms_norm", "args": [buffer_arg(p + "x"), buffer_arg(p + "attn_out"), buffer_arg(f"ln2.{l}"), buffer_arg(p + "h"),
                                                     value_arg(rows), value_arg("hidden"), value_arg(s.eps)]})
        calls.append(lin(p + "h", f"gate_up_w.{l}", p + "gate_up", {"mul": [2, "inter"]}, "hidden"))
        calls.append({"op": "silu_mul", "args": [buffer_arg(p + "gate_up"), buffer_arg(p + "act"), value_arg(rows), value_arg("inter")]})
        calls.append(lin(p + "act", f"down_w.{l}", p + "mlp_out", "hidden", "inter"))
    calls.append({"op": "add_rms_norm", "args": [buffer_arg(p + "x"), buffer_arg(p + "mlp_out"), buffer_arg("final_norm"), buffer_arg(p + "h"),
                                                 value_arg(rows), value_arg("hidden"), value_arg(s.eps)]})
    return calls


def _prefill_calls(s: Shape, p: str, pages) -> list:
    """Prefill, one op per step of the layer: cuBLASLt GEMMs, flash prefill attention. Its
    calls mirror the cpu reference one to one, so kern test compares every intermediate."""
    rows, seqs = "tokens", "prefill_seqs"
    q, _, _ = _qkv_slices(p)
    calls = _gemm_layers(s, p, rows, seqs, pages, lambda l: {"op": "attention_prefill", "args": [
        q, {"state": "kv"}, buffer_arg(p + "page_table"), buffer_arg(p + "cu_seqlens"), buffer_arg(p + "pos"), buffer_arg(p + "attn"), value_arg(rows),
        value_arg(seqs), value_arg(pages), value_arg(l), value_arg("layers"), value_arg("heads"), value_arg("kv_heads"), value_arg("head_dim"), value_arg("page_tokens"),
        value_arg("qkv_dim")]})
    calls.append({"op": "gather_last", "args": [buffer_arg(p + "h"), buffer_arg(p + "cu_seqlens"), buffer_arg(p + "last"), value_arg(seqs),
                                                value_arg("hidden")]})
    calls.append({"op": "gemv_logits", "args": [buffer_arg(p + "last"), buffer_arg("lm_head"), buffer_arg(p + "logits"), value_arg(seqs),
                                                value_arg("vocab"), value_arg("hidden")]})
    calls.append(_argmax(p, seqs))
    return calls


# The projections of the fused decode layer, as gemv kernels (the decode program's rows) or as
# their gemm twins (prefill's and the wide decode's rows): the same bits for a row either way
# (gemm.cu), which with attention_rows is what makes a request's bytes its own (docs/determinism.md).
GEMV_FAMILY = {"norm": "norm_gemv", "qkv": "norm_gemv_rope_append", "residual": "gemv_residual",
               "swiglu": "norm_gemv_swiglu", "logits": "norm_gemv_logits"}
GEMM_FAMILY = {k: op.replace("gemv", "gemm") for k, op in GEMV_FAMILY.items()}
# The wide decode's few rows: a projection with fewer column tiles than this splits K over 8
# blocks a tile (gemm.cu's *_split: the same bits), so that it fills the GPU; the wider ones
# have blocks enough. Half the H200's 132 SMs: a 1B's qkv (24 tiles), o and down (16) split,
# its gate/up (128) and the LM head stream whole (bench/probes/wg_split.py: 1B gate/up 28 us
# unsplit against 60 split at 16-64 rows, down 21 split against 67; docs/perf.md).
SPLIT_BELOW_TILES = 66


def _wide_family(s: Shape) -> tuple[dict, int]:
    """The wide decode's projections for shape s, and the most column tiles of its split ones
    (0: none split)."""
    bn = table.TILES["WG_BN"]  # W rows a block (gemm.cu), or half as many pairs
    tiles = {"qkv": -(-(s.q_dim + 2 * s.kv_dim) // bn), "norm": -(-(s.q_dim + 2 * s.kv_dim) // bn),
             "residual": -(-s.hidden // bn), "swiglu": -(-s.inter // (bn // 2))}
    split = {k: n for k, n in tiles.items() if n < SPLIT_BELOW_TILES}
    return {k: op + "_split" if k in split else op for k, op in GEMM_FAMILY.items()}, max(split.values(), default=0)


def _fused_layers(s: Shape, p: str, rows: str, seqs: str, pages, attention, ops: dict) -> list:
    """The embedding and every layer in five launches (six with q/k norms), `ops` naming the
    projections (GEMV_FAMILY or GEMM_FAMILY): the input norm, the qkv projection, rope and the KV
    append are one kernel; `attention(l)` is layer l's attention into `attn`; the o projection
    adds into the residual stream x; the post-attention norm, the gate/up projection and SwiGLU
    are one kernel; the down projection adds into x. Models with q/k norms (Qwen3) keep rope
    apart, after the normed qkv projection."""
    q, k, vv = _qkv_slices(p)
    calls = [{"op": "embed", "args": [buffer_arg(p + "ids"), buffer_arg("embed"), buffer_arg(p + "x"), value_arg(rows), value_arg("hidden")]}]

    def proj(key: str, args: list) -> dict:
        return _proj(p, ops[key], args)
    for l in range(s.layers):
        append = [{"state": "kv"}, buffer_arg(p + "page_table"), buffer_arg(p + "cu_seqlens"), buffer_arg(p + "pos"), buffer_arg("rope"), value_arg(pages),
                  value_arg(rows), value_arg(seqs), value_arg(l), value_arg("layers"), value_arg("heads"), value_arg("kv_heads"), value_arg("head_dim"),
                  value_arg("page_tokens")]
        if s.qk_norm:
            calls.append(proj("norm", [buffer_arg(p + "x"), buffer_arg(f"ln1.{l}"), buffer_arg(f"qkv_w.{l}"), buffer_arg(p + "qkv"), value_arg(rows),
                                       value_arg("qkv_dim"), value_arg("hidden"), value_arg(s.eps)]))
            calls.append({"op": "qk_norm_rope_append", "args": [q, k, vv, buffer_arg(f"q_norm.{l}"), buffer_arg(f"k_norm.{l}"),
                                                                *append, value_arg("qkv_dim"), value_arg("qkv_dim"), value_arg(s.eps)]})
        else:
            calls.append(proj("qkv", [buffer_arg(p + "x"), buffer_arg(f"ln1.{l}"), buffer_arg(f"qkv_w.{l}"), buffer_arg(p + "qkv"), *append,
                                      value_arg("qkv_dim"), value_arg("hidden"), value_arg(s.eps)]))
        calls.append(attention(l))
        calls.append(proj("residual", [buffer_arg(p + "attn"), buffer_arg(f"o_w.{l}"), buffer_arg(p + "x"), value_arg(rows), value_arg("hidden"), value_arg("q_dim")]))
        calls.append(proj("swiglu", [buffer_arg(p + "x"), buffer_arg(f"ln2.{l}"), buffer_arg(f"gate_up_w.{l}"), buffer_arg(p + "act"), value_arg(rows),
                                     value_arg("inter"), value_arg("hidden"), value_arg(s.eps)]))
        calls.append(proj("residual", [buffer_arg(p + "act"), buffer_arg(f"down_w.{l}"), buffer_arg(p + "x"), value_arg(rows), value_arg("hidden"),
                                       value_arg("inter")]))
    return calls


def _proj(p: str, op: str, args: list) -> dict:
    """A projection call: the gemm twins take their scratch after the pointers (a normed one
    rms_prep's x and 1/rms a row, a split one its partials and counters)."""
    n = next(i for i, a in enumerate(args) if "value" in a)
    scratch = [buffer_arg(p + "xn"), buffer_arg(p + "rs")] if op.startswith("norm_gemm") else []
    if op.endswith("_split"):
        scratch += [buffer_arg(p + "gpart"), buffer_arg(p + "gsem")]
    return {"op": op, "args": [*args[:n], *scratch, *args[n:]]}


def _decode_attention(s: Shape, p: str, rows: str, pages, split: int, heads_a_block: int):
    q, _, _ = _qkv_slices(p)
    return lambda l: {"op": "attention_decode", "args": [
        q, {"state": "kv"}, buffer_arg(p + "page_table"), buffer_arg(p + "pos"), buffer_arg(p + "part_o"), buffer_arg(p + "part_ml"),
        buffer_arg(p + "sem"), buffer_arg(p + "attn"), value_arg(rows), value_arg(pages), value_arg(l), value_arg("layers"), value_arg("heads"), value_arg("kv_heads"),
        value_arg("head_dim"), value_arg("page_tokens"), value_arg(split), value_arg("qkv_dim"), value_arg({"ceil_div": ["reach", split]}),
        value_arg(head_groups(s, heads_a_block))]}


def _decode_calls(s: Shape, p: str, pages, split: int, ops: dict = GEMV_FAMILY, rows: str = "seqs",
                  heads_a_block: int = DECODE_GROUP_HEADS) -> list:
    """Decode, one row a sequence (a CUDA graph of PDL launches), five launches a layer
    (_fused_layers). Attention's grid takes the context splits the step's reach holds, not the
    context bound's: at a context of 100, 2 blocks a (row, kv head) instead of 64 that mostly
    leave at once. ops = GEMM_FAMILY: the wide decode program, the same bits for every row
    (heads_a_block: WIDE_GROUP_HEADS there; the grouping does not change a bit)."""
    calls = _fused_layers(s, p, rows, rows, pages, _decode_attention(s, p, rows, pages, split, heads_a_block), ops)
    calls.append(_proj(p, ops["logits"], [buffer_arg(p + "x"), buffer_arg("final_norm"), buffer_arg("lm_head"), buffer_arg(p + "logits"),
                                          value_arg(rows), value_arg("vocab"), value_arg("hidden"), value_arg(s.eps)]))
    calls.append(_argmax(p, rows))
    return calls


def _rows_attention(p: str, rows: str, seqs: str, pages, split: int):
    """Ragged rows' attention in decode's split order (attention_rows), layer by layer."""
    q, _, _ = _qkv_slices(p)
    return lambda l: {"op": "attention_rows", "args": [
        q, {"state": "kv"}, buffer_arg(p + "page_table"), buffer_arg(p + "cu_seqlens"), buffer_arg(p + "pos"), buffer_arg(p + "attn"), value_arg(rows),
        value_arg(seqs), value_arg(pages), value_arg(l), value_arg("layers"), value_arg("heads"), value_arg("kv_heads"), value_arg("head_dim"), value_arg("page_tokens"),
        value_arg(split), value_arg("qkv_dim")]}


def _invariant_prefill_calls(s: Shape, p: str, pages, split: int) -> list:
    """Prefill as decode computes each row: the gemm twins of decode's projections and
    attention_rows (decode's split order), so a prompt's last token gets the same logits here
    as decoded after a cache hit; the LM head takes each sequence's last row of x (`last_x`)."""
    rows, seqs = "tokens", "prefill_seqs"
    calls = _fused_layers(s, p, rows, seqs, pages, _rows_attention(p, rows, seqs, pages, split), GEMM_FAMILY)
    calls.append({"op": "gather_last", "args": [buffer_arg(p + "x"), buffer_arg(p + "cu_seqlens"), buffer_arg(p + "last_x"), value_arg(seqs),
                                                value_arg("hidden")]})
    calls.append(_proj(p, GEMM_FAMILY["logits"], [buffer_arg(p + "last_x"), buffer_arg("final_norm"), buffer_arg("lm_head"),
                                                  buffer_arg(p + "logits"), value_arg(seqs), value_arg("vocab"), value_arg("hidden"), value_arg(s.eps)]))
    calls.append(_argmax(p, seqs))
    return calls


def _verify_calls(s: Shape, p: str, pages, split: int) -> list:
    """A speculative round: each sequence's last token and its proposed tokens as ragged rows,
    every row computed as a decode row (the gemv kernels, and attention_rows), each row's K/V
    appended at its position; the LM head and the draw over every row, then `accept` (a thread
    a sequence) counts the proposed tokens kept. What rows past the kept ones wrote lies past the sequence's length: never read."""
    rows, seqs = "verify_tokens", "verify_seqs"
    # the gemv kernels: a round's few rows (a lone stream's k + 1) read each weight once, as a
    # decode step does, where the split twins pay the wide decode's partial stores and rms_prep
    # launches; the same bits either way (gemm.cu), past 32 rows in passes of 32
    family = GEMV_FAMILY
    calls = _fused_layers(s, p, rows, seqs, pages, _rows_attention(p, rows, seqs, pages, split), family)
    calls.append(_proj(p, family["logits"], [buffer_arg(p + "x"), buffer_arg("final_norm"), buffer_arg("lm_head"), buffer_arg(p + "logits"),
                                             value_arg(rows), value_arg("vocab"), value_arg("hidden"), value_arg(s.eps)]))
    calls.append(_argmax(p, rows))
    calls.append({"op": "accept", "args": [buffer_arg(p + "ids"), buffer_arg(p + "cu_seqlens"), buffer_arg(p + "next"), buffer_arg(p + "accepted"),
                                           value_arg(seqs)]})
    return calls


def _wide_calls(s: Shape, p: str, pages, split: int) -> list:
    """Decode of many sequences, one row each, not batch-invariant (batch_invariant=False): the prefill
    program's GEMM layers (cuBLASLt, weights read once a step for every row) with decode
    attention over each sequence's pages, and the LM head as a GEMM with fp32 output."""
    rows = "wide_seqs"
    calls = _gemm_layers(s, p, rows, rows, pages, _decode_attention(s, p, rows, pages, split, WIDE_GROUP_HEADS))
    calls.append({"op": "gemm_logits", "args": [buffer_arg(p + "h"), buffer_arg("lm_head"), buffer_arg(p + "logits"), value_arg(rows), value_arg("vocab"),
                                                value_arg("hidden")]})
    calls.append(_argmax(p, rows))
    return calls


def _argmax(p: str, seqs: str) -> dict:
    """Each sequence's next token: its logits' argmax, or a draw at its temperature (cuda/argmax.cu)."""
    return {"op": "sample", "args": [buffer_arg(p + "logits"), *sampling_args(p), buffer_arg(p + "argmax_val"), buffer_arg(p + "argmax_idx"),
                                     buffer_arg(p + "next"), value_arg("vocab"), value_arg(seqs), value_arg(ARGMAX_CHUNKS)]}


def check_shape(s: Shape, decode_split: int = DECODE_SPLIT) -> None:
    """What these kernels support (cuda/KERNELS.md); every problem at once, as a ConfigError."""
    problems = []
    if s.head_dim not in (64, 128):
        problems.append(f"head_dim {s.head_dim}: the attention kernels take 64 or 128")
    if s.heads % s.kv_heads or s.heads // s.kv_heads > 8:
        problems.append(f"{s.heads} query heads over {s.kv_heads} kv heads: the attention kernels need a "
                        "whole group of at most 8 query heads a kv head")
    if s.vocab >= 1 << 29:
        problems.append(f"vocab_size {s.vocab}: the sampling kernel takes fewer than 2^29 tokens")
    for name, n in (("hidden_size", s.hidden), ("intermediate_size", s.inter)):
        if n % 8:
            problems.append(f"{name} {n}: the gemv kernels need a multiple of 8")
    if decode_split < 1 or (s.head_dim in (64, 128) and decode_split % (4096 // s.head_dim)):
        problems.append(f"decode_split {decode_split}: the attention kernels cut a chunk in tiles of "
                        f"{4096 // s.head_dim} keys at head_dim {s.head_dim}: a positive multiple of it")
    if problems:
        raise ConfigError("cannot build the sm_90a manifest: " + "; ".join(problems))


# The page a host (vLLM) allocating the KV state must lay out: kv_offset's order in common.cuh.
HOST_KV = {"dtype": "bf16", "page": [{"axis": "layer", "size": "layers"}, {"axis": "kv", "size": 2},
                                     {"axis": "kv_head", "size": "kv_heads"}, {"axis": "token", "size": "page_tokens"},
                                     {"axis": "dim", "size": "head_dim"}]}


def build(s: Shape, model: str, *, tokens: int = 2048, seqs: int = GEMV_SEQS, prefill_seqs: int = PREFILL_SEQS,
          context: int | None = None, decode_split: int = DECODE_SPLIT, batch_invariant: bool = True) -> dict:
    """seqs: the decode program's sequences (a CUDA graph each); prefill_seqs: the prefill
    program's (ragged rows, so also the path for decode batches larger than seqs).
    decode_split: context tokens per decode attention block (bench/decode.py --decode-split).
    batch_invariant (the default): every program computes a row as the gemv decode program does
    (gemm.cu's twins, attention_rows), so a request's bytes do not depend on the batch, the
    cache or the chunking (docs/determinism.md); False: cuBLASLt GEMMs and flash prefill
    attention, whose bits depend on the rows beside a row (the MoE, tensor-parallel and
    megakernel manifests build on this one)."""
    check_shape(s, decode_split)
    if seqs > DECODE_SEQS:
        raise ConfigError(f"seqs {seqs}: the graph-captured decode program steps at most {DECODE_SEQS} sequences "
                          f"(larger batches step through the prefill program, up to prefill_seqs)")
    context = context_of(s, context, MAX_CONTEXT)
    tokens = tokens_of(tokens, MAX_STEP_TOKENS)
    pages = {"ceil_div": ["context", "page_tokens"]}
    buffers: dict = {"rope": buffer(["context", "head_dim"], "carry"), **weight_buffers(s, BF)}

    programs: dict = {
        "rope_init": {"once": True, "calls": [{"op": "rope_table", "args": [
            buffer_arg("rope"), value_arg("context"), value_arg("head_dim"), value_arg(s.theta), value_arg(s.rope_factor), value_arg(s.rope_low), value_arg(s.rope_high),
            value_arg(s.rope_orig_max)]}]},
    }
    steppers = [("prefill", "tokens", "prefill_seqs"), ("decode", "seqs", "seqs"),
                ("decode_wide", "wide_seqs", "wide_seqs")]
    if batch_invariant:  # a verify row is a decode row's bits only where every program is invariant
        steppers.append(("verify_round", "verify_tokens", "verify_seqs"))
    for prog, rows, gseqs in steppers:
        p = {"prefill": "p_", "decode": "d_", "decode_wide": "w_", "verify_round": "v_"}[prog]
        decode, verify = prog.startswith("decode"), prog == "verify_round"
        per = rows if verify else gseqs  # what a token is drawn for: each sequence, or each row (verify)
        bw = lambda shape, kind="workspace", dtype=BF, **kw: buffer(shape, kind, dtype, **kw)
        buffers.update({
            p + "ids": buffer([rows], "input", "i32", fill="token", domain={"range": [0, "vocab"]}),
            # decode positions are bounded by the step's reach (the protocol sets it), prefill's by the context
            p + "pos": buffer([rows], "input", "i32", fill="position",
                            domain={"range": [0, "reach" if decode else "context"]}),
            p + "cu_seqlens": buffer([{"add": [gseqs, 1]}], "input", "i32", fill="cu_seqlens",
                                   domain={"range": [0, {"add": [rows, 1]}]}),
            p + "page_table": buffer([gseqs, pages], "input", "i32",
                                   domain={"index_into": "kv", "stride": "page_tokens"}),
            p + "x": bw([rows, "hidden"]), p + "h": bw([rows, "hidden"]), p + "qkv": bw([rows, "qkv_dim"]),
            p + "attn": bw([rows, "q_dim"]), p + "attn_out": bw([rows, "hidden"]),
            p + "gate_up": bw([rows, {"mul": [2, "inter"]}]), p + "act": bw([rows, "inter"]),
            p + "mlp_out": bw([rows, "hidden"]),
            p + "logits": buffer([per, "vocab"], "output", "f32", fill="logits"),
            p + "argmax_val": bw([per, ARGMAX_CHUNKS], dtype="f32"),
            p + "argmax_idx": bw([per, ARGMAX_CHUNKS], dtype="i32"),
            p + "next": buffer([per], "output", "i32", fill="tokens"),
            **sampling_inputs(p, per),
        })
        if verify:
            buffers[p + "accepted"] = buffer([gseqs], "output", "i32", fill="accepted")
        if decode:
            n_splits = max(-(-context // decode_split), 2)
            buffers[p + "part_o"] = bw([rows, "heads", n_splits, "head_dim"], dtype="f32")
            buffers[p + "part_ml"] = bw([rows, "heads", n_splits, 2], dtype="f32")
            buffers[p + "sem"] = buffer([rows, "heads"], "carry", "i32")  # a counter a (kv head, head group)
        if prog == "decode" or batch_invariant:
            for n in ("h", "attn_out", "gate_up", "mlp_out"):
                del buffers[p + n]  # fused away: see _fused_layers
        if prog not in ("decode", "verify_round") and batch_invariant:  # rms_prep's x and 1/rms a row, for the normed gemm twins
            buffers[p + "xn"] = bw([rows, "hidden"])
            buffers[p + "rs"] = bw([rows], dtype="f32")
        if prog == "decode":
            calls = _decode_calls(s, p, pages, decode_split)
        elif prog in ("decode_wide", "verify_round"):
            family, tiles_x = _wide_family(s)
            calls = (_verify_calls(s, p, pages, decode_split) if verify else
                     _decode_calls(s, p, pages, decode_split, family, rows, WIDE_GROUP_HEADS) if batch_invariant
                     else _wide_calls(s, p, pages, decode_split))
            if batch_invariant and tiles_x and not verify:  # the split projections' scratch and counters, for the widest of them
                tiles = {"mul": [{"ceil_div": [rows, 64]}, tiles_x]}
                buffers[p + "gpart"] = bw([{"mul": [tiles, table.GEMM_SPLIT * table.TILES["WG_SPLIT_PART"]]}],
                                          dtype="f32")
                buffers[p + "gsem"] = buffer([tiles], "carry", "i32")
        else:
            # each sequence's last row: of h (normed) for the LM head, or of x (the residual
            # stream) where the head's kernel applies the final norm itself; two names, since kern
            # test pairs the buffers two builds share by name
            buffers[p + ("last_x" if batch_invariant else "last")] = bw([gseqs, "hidden"])
            calls = (_invariant_prefill_calls(s, p, pages, decode_split) if batch_invariant
                     else _prefill_calls(s, p, pages))
        # decode and verify are CUDA graphs (one a batch size and reach bucket; a round's one a
        # (sequences, rows) pair, captured as first met): their launches cost more than their rows
        programs[prog] = {"calls": calls, "graph": decode or verify,
                          "batch": program_batch(gseqs, rows, decode)}

    used = {c["op"] for prog in programs.values() for c in prog["calls"]}
    ops = {name: op for name, op in table.ops().items() if name in used}
    modules = sorted({la["module"] for op in ops.values() for la in op["impl"]["launches"] if "module" in la})
    return {
        "schema_version": 1, "model": model, "target": {"device": "cuda", "arch": table.ARCH},
        "constants": {
            "hidden": s.hidden, "layers": s.layers, "heads": s.heads, "kv_heads": s.kv_heads,
            "head_dim": s.head_dim, "inter": s.inter, "vocab": s.vocab, "page_tokens": PAGE_TOKENS,
            "q_dim": {"mul": ["heads", "head_dim"]},
            **({"kv_dim": {"mul": ["kv_heads", "head_dim"]}} if s.qk_norm or not batch_invariant else {}),  # v's offset
            "qkv_dim": {"mul": [{"add": ["heads", {"mul": [2, "kv_heads"]}]}, "head_dim"]},
        },
        "vars": {"tokens": {"max": tokens}, "prefill_seqs": {"max": prefill_seqs}, "seqs": {"max": seqs},
                 "wide_seqs": {"max": WIDE_SEQS}, "context": {"max": context},
                 "reach": {"max": context}, MASK_ROWS: {"max": max(seqs, prefill_seqs, WIDE_SEQS)},
                 **({"verify_tokens": {"max": VERIFY_ROWS}, "verify_seqs": {"max": VERIFY_SEQS}} if batch_invariant else {})},
        "buffers": buffers,
        "states": {"kv": {"bytes_per_token": {"mul": ["layers", 2, "kv_heads", "head_dim", 2]},
                          "host": HOST_KV}},
        "modules": {name: {"source": f"kernels/{name}.cubin", "sha256": ""} for name in modules},
        "ops": ops, "programs": programs,
    }
