"""The llama family's manifest for cuda sm_90a: bf16 buffers, the kernels of cuda/KERNELS.md,
cuBLASLt for prefill projections, CUDA graphs for decode.

Buffer and program names match the cpu manifest (manifest_cpu.py), so kern test can judge this
manifest span by span against the cpu reference of the same model."""

from __future__ import annotations

from .config import ConfigError, Shape
from .manifest_cpu import PAGE_TOKENS, _buf, b, v, weight_buffers

BF = "bf16"
# Context split of attention: decode spreads a sequence's context over blocks of one tile
# each (128 tokens at head_dim 64: a context that fits is one pass with no merge); prefill keeps
# splits long so its partials stay small for thousands of rows.
SPLIT_TOKENS = {"prefill": 512, "decode": 128}
ARGMAX_CHUNKS = 128
CUBINS = ("argmax", "attention", "embed", "gemv", "kv", "mlp", "norm", "prefill_attention", "rope")


# Decode launches after the first carry the PDL attribute (programmatic dependent launch): a
# kernel may start while the one before it finishes, streams its weights, and waits
# (griddepcontrol.wait) before it reads anything the previous kernel wrote or writes anything.
# Most let the next one start only after that wait; attention_decode and gemv_residual let it
# start at entry, and the order of these calls is what keeps that safe (cuda/common.cuh;
# tests/cuda/test_cuda_pdl_order.py). Activations and the KV state are read at L2
# (ld.global.cg / cp.async.cg): neither the non-coherent path nor L1 is safe, their lines may
# predate the previous kernel's writes (the race that made the first PDL attempt wrong; see
# docs/perf.md).
def _op(module, entry, params, grid, block, pdl=False):
    launch = {"module": module, "entry": entry, "grid": grid, "block": block}
    if pdl:
        launch["pdl"] = True
    return {"params": list(params), "impl": {"launches": [launch]}}


def ops_cuda() -> dict:
    P = lambda n, d="bf16", dir_="in": f"{n}: {dir_} buffer<{d}>"
    gemv_grid = [{"ceil_div": ["N", 16]}]
    norm = (P("x"), P("w"), P("y", dir_="out"), "rows: i32", "hidden: i32", "eps: f32")
    attn_common = ("layer: i32", "n_layers: i32", "n_q_heads: i32", "n_kv_heads: i32", "head_dim: i32",
                   "page_tokens: i32", "split_tokens: i32", "q_stride: i32")
    return {
        "embed": _op("embed", "embed", (P("ids", "i32"), P("W"), P("x", dir_="out"), "rows: i32", "hidden: i32"),
                     ["rows"], [256]),
        "gather_last": _op("embed", "gather_last", (P("x"), P("cu_seqlens", "i32"), P("y", dir_="out"),
                                                   "n_seqs: i32", "hidden: i32"), ["n_seqs"], [256]),
        "rms_norm": _op("norm", "rms_norm", norm, ["rows"], [256]),
        "add_rms_norm": _op("norm", "add_rms_norm", (P("res", dir_="inout"), P("x"), P("w"), P("y", dir_="out"),
                                                    "rows: i32", "hidden: i32", "eps: f32"), ["rows"], [256]),
        "rope_table": _op("rope", "rope_table", (P("table", "f32", "out"), "max_pos: i32", "head_dim: i32",
                          "theta: f32", "factor: f32", "low_freq_factor: f32", "high_freq_factor: f32",
                          "original_max_pos: i32"), ["max_pos"], [{"ceil_div": ["head_dim", 2]}]),
        "rope": _op("rope", "rope", (P("q", dir_="inout"), P("k", dir_="inout"), P("pos", "i32"), P("table", "f32"),
                    "rows: i32", "n_q_heads: i32", "n_kv_heads: i32", "head_dim: i32", "q_stride: i32",
                    "k_stride: i32"), ["rows", {"add": ["n_q_heads", "n_kv_heads"]}],
                    [{"ceil_div": ["head_dim", 2]}]),
        "qk_norm_rope": _op("rope", "qk_norm_rope", (P("q", dir_="inout"), P("k", dir_="inout"), P("qw"), P("kw"),
                            P("pos", "i32"), P("table", "f32"), "rows: i32", "n_q_heads: i32", "n_kv_heads: i32",
                            "head_dim: i32", "q_stride: i32", "k_stride: i32", "eps: f32"),
                            ["rows", {"add": ["n_q_heads", "n_kv_heads"]}], [{"ceil_div": ["head_dim", 2]}]),
        "qk_norm_rope_append": _op("rope", "qk_norm_rope_append", (
            P("q", dir_="inout"), P("k", dir_="inout"), P("v"), P("qw"), P("kw"), "kv: inout state",
            P("page_table", "i32"), P("cu_seqlens", "i32"), P("pos", "i32"), P("table", "f32"), "pages_per_seq: i32",
            "rows: i32", "n_seqs: i32", "layer: i32", "n_layers: i32", "n_q_heads: i32", "n_kv_heads: i32",
            "head_dim: i32", "page_tokens: i32", "q_stride: i32", "k_stride: i32", "eps: f32"),
            ["rows", {"add": ["n_q_heads", "n_kv_heads"]}], [{"ceil_div": ["head_dim", 2]}], pdl=True),
        "kv_append": _op("kv", "kv_append", (P("k"), P("v"), "kv: inout state", P("page_table", "i32"),
                         P("cu_seqlens", "i32"), P("pos", "i32"), "pages_per_seq: i32", "rows: i32",
                         "n_seqs: i32", "layer: i32", "n_layers: i32", "n_kv_heads: i32", "head_dim: i32",
                         "page_tokens: i32", "kv_stride: i32"), ["rows", "n_kv_heads"], [32]),
        # sem: the split counters, zero between launches (the merging block resets them), so
        # the launch leaves it as it found it and does not list it among its writes.
        "attention_decode": {"params": [P("q"), "kv: in state", P("page_table", "i32"), P("pos", "i32"),
                                        P("part_o", "f32", "out"), P("part_ml", "f32", "out"),
                                        P("sem", "i32", "inout"), P("o", dir_="out"),
                                        "rows: i32", "pages_per_seq: i32", *attn_common, "n_splits: i32"],
                             "impl": {"launches": [
                                 {"module": "attention", "entry": "attention_decode", "pdl": True,
                                  "args": ["q", "kv", "page_table", "pos", "part_o", "part_ml", "sem", "o", "rows",
                                           "pages_per_seq", "layer", "n_layers", "n_q_heads", "n_kv_heads",
                                           "head_dim", "page_tokens", "split_tokens", "q_stride"],
                                  "writes": ["part_o", "part_ml", "o"],
                                  "grid": ["rows", "n_kv_heads", "n_splits"], "block": [128]}]}},
        "attention_prefill": _op("prefill_attention", "prefill_attention", (
            P("q"), "kv: in state", P("page_table", "i32"), P("cu_seqlens", "i32"), P("pos", "i32"),
            P("o", dir_="out"), "rows: i32", "n_seqs: i32", "pages_per_seq: i32", "layer: i32", "n_layers: i32",
            "n_q_heads: i32", "n_kv_heads: i32", "head_dim: i32", "page_tokens: i32", "q_stride: i32"),
            ["n_q_heads", {"add": [{"ceil_div": ["rows", 64]}, "n_seqs"]}], [128]),
        "silu_mul": _op("mlp", "silu_mul", (P("gate_up"), P("h", dir_="out"), "rows: i32", "inter: i32"),
                        ["rows", {"ceil_div": ["inter", 2048]}], [256]),
        "norm_gemv": _op("gemv", "norm_gemv_bf16", (P("res"), P("nw"), P("W"), P("y", dir_="out"), "rows: i32",
                                                    "N: i32", "K: i32", "eps: f32"), gemv_grid, [256], pdl=True),
        "norm_gemv_logits": _op("gemv", "norm_gemv_f32", (P("res"), P("nw"), P("W"), P("y", "f32", "out"),
                                "rows: i32", "N: i32", "K: i32", "eps: f32"), gemv_grid, [256], pdl=True),
        "gemv_residual": _op("gemv", "gemv_residual", (P("x"), P("W"), P("res", dir_="inout"), "rows: i32",
                                                       "N: i32", "K: i32"), gemv_grid, [256], pdl=True),
        "gemv": _op("gemv", "gemv_bf16", (P("x"), P("W"), P("y", dir_="out"), "rows: i32", "N: i32", "K: i32"),
                    gemv_grid, [256], pdl=True),
        "norm_gemv_swiglu": _op("gemv", "norm_gemv_swiglu", (P("res"), P("nw"), P("W"), P("act", dir_="out"),
                                "rows: i32", "N: i32", "K: i32", "eps: f32"), [{"ceil_div": ["N", 8]}], [256], pdl=True),
        "norm_gemv_rope_append": _op("gemv", "norm_gemv_rope_append", (
            P("res"), P("nw"), P("W"), P("y", dir_="out"), "kv: inout state", P("page_table", "i32"),
            P("cu_seqlens", "i32"), P("pos", "i32"), P("table", "f32"), "pages_per_seq: i32", "rows: i32",
            "n_seqs: i32", "layer: i32", "n_layers: i32", "n_q_heads: i32", "n_kv_heads: i32", "head_dim: i32",
            "page_tokens: i32", "N: i32", "K: i32", "eps: f32"), gemv_grid, [256], pdl=True),
        "gemv_logits": _op("gemv", "gemv_f32", (P("x"), P("W"), P("y", "f32", "out"), "rows: i32", "N: i32",
                                                "K: i32"), [{"ceil_div": ["N", 16]}], [256]),
        "gemm": {"params": [P("x"), P("W"), P("y", dir_="out"), "M: i32", "N: i32", "K: i32"],
                 "impl": {"launches": [{"entry": "extern:cublaslt_bf16_tn"}]}},
        "argmax": {"params": [P("logits", "f32"), P("part_val", "f32", "out"), P("part_idx", "i32", "out"),
                              P("tokens", "i32", "out"), "vocab: i32", "n_rows: i32", "chunks: i32"],
                   "impl": {"launches": [
                       {"module": "argmax", "entry": "argmax_partial", "pdl": True, "args": ["logits", "part_val", "part_idx",
                        "vocab", "n_rows", "chunks"], "grid": ["chunks", "n_rows"], "block": [256]},
                       {"module": "argmax", "entry": "argmax_final", "pdl": True, "args": ["part_val", "part_idx", "tokens",
                        "n_rows", "chunks"], "grid": ["n_rows"], "block": [32]}]}},
    }


def _qkv_slices(p: str):
    q = {"buf": p + "qkv"}
    k = {"buf": p + "qkv", "offset": "q_dim"}
    vv = {"buf": p + "qkv", "offset": {"add": ["q_dim", "kv_dim"]}}
    return q, k, vv


def _prefill_calls(s: Shape, p: str, pages) -> list:
    """Prefill, one op per step of the layer: cuBLASLt GEMMs, flash prefill attention. Its
    calls mirror the cpu reference one to one, so kern test compares every intermediate."""
    rows = "tokens"
    q, k, vv = _qkv_slices(p)
    lin = lambda x, w, y, n, kk: {"op": "gemm", "args": [b(x), b(w), b(y), v(rows), v(n), v(kk)]}
    calls = [{"op": "embed", "args": [b(p + "ids"), b("embed"), b(p + "x"), v(rows), v("hidden")]}]
    for l in range(s.layers):
        if l == 0:
            calls.append({"op": "rms_norm", "args": [b(p + "x"), b("ln1.0"), b(p + "h"), v(rows), v("hidden"),
                                                     v(s.eps)]})
        else:
            calls.append({"op": "add_rms_norm", "args": [b(p + "x"), b(p + "mlp_out"), b(f"ln1.{l}"),
                                                         b(p + "h"), v(rows), v("hidden"), v(s.eps)]})
        calls.append(lin(p + "h", f"qkv_w.{l}", p + "qkv", "qkv_dim", "hidden"))
        if s.qk_norm:
            calls.append({"op": "qk_norm_rope", "args": [q, k, b(f"q_norm.{l}"), b(f"k_norm.{l}"), b(p + "pos"),
                          b("rope"), v(rows), v("heads"), v("kv_heads"), v("head_dim"), v("qkv_dim"),
                          v("qkv_dim"), v(s.eps)]})
        else:
            calls.append({"op": "rope", "args": [q, k, b(p + "pos"), b("rope"), v(rows), v("heads"),
                                                 v("kv_heads"), v("head_dim"), v("qkv_dim"), v("qkv_dim")]})
        calls.append({"op": "kv_append", "args": [k, vv, {"state": "kv"}, b(p + "page_table"),
                      b(p + "cu_seqlens"), b(p + "pos"), v(pages), v(rows), v("seqs"), v(l), v("layers"),
                      v("kv_heads"), v("head_dim"), v("page_tokens"), v("qkv_dim")]})
        calls.append({"op": "attention_prefill", "args": [q, {"state": "kv"}, b(p + "page_table"),
                      b(p + "cu_seqlens"), b(p + "pos"), b(p + "attn"), v(rows), v("seqs"), v(pages),
                      v(l), v("layers"), v("heads"), v("kv_heads"), v("head_dim"), v("page_tokens"),
                      v("qkv_dim")]})
        calls.append(lin(p + "attn", f"o_w.{l}", p + "attn_out", "hidden", "q_dim"))
        calls.append({"op": "add_rms_norm", "args": [b(p + "x"), b(p + "attn_out"), b(f"ln2.{l}"), b(p + "h"),
                                                     v(rows), v("hidden"), v(s.eps)]})
        calls.append(lin(p + "h", f"gate_up_w.{l}", p + "gate_up", {"mul": [2, "inter"]}, "hidden"))
        calls.append({"op": "silu_mul", "args": [b(p + "gate_up"), b(p + "act"), v(rows), v("inter")]})
        calls.append(lin(p + "act", f"down_w.{l}", p + "mlp_out", "hidden", "inter"))
    calls.append({"op": "add_rms_norm", "args": [b(p + "x"), b(p + "mlp_out"), b("final_norm"), b(p + "h"),
                                                 v(rows), v("hidden"), v(s.eps)]})
    calls.append({"op": "gather_last", "args": [b(p + "h"), b(p + "cu_seqlens"), b(p + "last"), v("seqs"),
                                                v("hidden")]})
    calls.append({"op": "gemv_logits", "args": [b(p + "last"), b("lm_head"), b(p + "logits"), v("seqs"),
                                                v("vocab"), v("hidden")]})
    calls.append(_argmax(p))
    return calls


def _decode_calls(s: Shape, p: str, pages, split: int) -> list:
    """Decode, five launches a layer (a CUDA graph of PDL launches): the input norm, the qkv
    projection, rope and the KV append are one kernel; attention merges its own context
    splits; the o projection adds into the residual stream x; the post-attention norm, the
    gate/up projection and SwiGLU are one kernel; the down projection adds into x. Models with
    q/k norms (Qwen3) keep rope apart, after the normed qkv projection: six a layer.
    Attention's grid takes the context splits the step's reach holds, not the context bound's:
    at a context of 100, 2 blocks a (row, kv head) instead of 64 that mostly leave at once."""
    rows = "seqs"
    q, k, vv = _qkv_slices(p)
    calls = [{"op": "embed", "args": [b(p + "ids"), b("embed"), b(p + "x"), v(rows), v("hidden")]}]
    for l in range(s.layers):
        append = [{"state": "kv"}, b(p + "page_table"), b(p + "cu_seqlens"), b(p + "pos"), b("rope"), v(pages),
                  v(rows), v("seqs"), v(l), v("layers"), v("heads"), v("kv_heads"), v("head_dim"),
                  v("page_tokens")]
        if s.qk_norm:
            calls.append({"op": "norm_gemv", "args": [b(p + "x"), b(f"ln1.{l}"), b(f"qkv_w.{l}"), b(p + "qkv"),
                                                      v(rows), v("qkv_dim"), v("hidden"), v(s.eps)]})
            calls.append({"op": "qk_norm_rope_append", "args": [q, k, vv, b(f"q_norm.{l}"), b(f"k_norm.{l}"),
                                                                *append, v("qkv_dim"), v("qkv_dim"), v(s.eps)]})
        else:
            calls.append({"op": "norm_gemv_rope_append", "args": [
                b(p + "x"), b(f"ln1.{l}"), b(f"qkv_w.{l}"), b(p + "qkv"), *append, v("qkv_dim"), v("hidden"),
                v(s.eps)]})
        calls.append({"op": "attention_decode", "args": [
            q, {"state": "kv"}, b(p + "page_table"), b(p + "pos"), b(p + "part_o"), b(p + "part_ml"),
            b(p + "sem"), b(p + "attn"), v(rows), v(pages), v(l), v("layers"), v("heads"), v("kv_heads"),
            v("head_dim"), v("page_tokens"), v(split), v("qkv_dim"), v({"ceil_div": ["reach", split]})]})
        calls.append({"op": "gemv_residual", "args": [b(p + "attn"), b(f"o_w.{l}"), b(p + "x"), v(rows),
                                                      v("hidden"), v("q_dim")]})
        calls.append({"op": "norm_gemv_swiglu", "args": [b(p + "x"), b(f"ln2.{l}"), b(f"gate_up_w.{l}"),
                                                         b(p + "act"), v(rows), v("inter"), v("hidden"), v(s.eps)]})
        calls.append({"op": "gemv_residual", "args": [b(p + "act"), b(f"down_w.{l}"), b(p + "x"), v(rows),
                                                      v("hidden"), v("inter")]})
    calls.append({"op": "norm_gemv_logits", "args": [b(p + "x"), b("final_norm"), b("lm_head"), b(p + "logits"),
                                                     v(rows), v("vocab"), v("hidden"), v(s.eps)]})
    calls.append(_argmax(p))
    return calls


def _argmax(p: str) -> dict:
    return {"op": "argmax", "args": [b(p + "logits"), b(p + "argmax_val"), b(p + "argmax_idx"), b(p + "next"),
                                     v("vocab"), v("seqs"), v(ARGMAX_CHUNKS)]}


def check_shape(s: Shape, decode_split: int = SPLIT_TOKENS["decode"]) -> None:
    """What these kernels support (cuda/KERNELS.md); every problem at once, as a ConfigError."""
    problems = []
    if s.head_dim not in (64, 128, 256):
        problems.append(f"head_dim {s.head_dim}: the attention kernels take 64, 128 or 256")
    if s.heads % s.kv_heads or s.heads // s.kv_heads > 8:
        problems.append(f"{s.heads} query heads over {s.kv_heads} kv heads: the attention kernels need a "
                        "whole group of at most 8 query heads a kv head")
    for name, n in (("hidden_size", s.hidden), ("intermediate_size", s.inter)):
        if n % 8:
            problems.append(f"{name} {n}: the gemv kernels need a multiple of 8")
    if decode_split < 1:
        problems.append(f"decode_split {decode_split}: must be at least 1")
    if problems:
        raise ConfigError("cannot build the sm_90a manifest: " + "; ".join(problems))


def build(s: Shape, model: str, *, tokens: int = 2048, seqs: int = 32, context: int = 4096,
          arch: str = "sm_90a", decode_split: int = SPLIT_TOKENS["decode"]) -> dict:
    """decode_split: context tokens per decode attention block (bench/decode.py --decode-split)."""
    check_shape(s, decode_split)
    context = min(context, s.max_pos)
    pages = {"ceil_div": ["context", "page_tokens"]}
    buffers: dict = {"rope": _buf(["context", "head_dim"], "carry"), **weight_buffers(s, BF)}

    programs: dict = {
        "rope_init": {"once": True, "calls": [{"op": "rope_table", "args": [
            b("rope"), v("context"), v("head_dim"), v(s.theta), v(s.rope_factor), v(s.rope_low), v(s.rope_high),
            v(s.rope_orig_max)]}]},
    }
    for prog, rows in (("prefill", "tokens"), ("decode", "seqs")):
        p = prog[0] + "_"
        decode = prog == "decode"
        split = decode_split if prog == "decode" else SPLIT_TOKENS[prog]
        n_splits = max(-(-context // split), 2)
        bw = lambda shape, kind="workspace", dtype=BF, **kw: _buf(shape, kind, dtype, **kw)
        buffers.update({
            p + "ids": _buf([rows], "input", "i32", fill="token", domain={"range": [0, "vocab"]}),
            # decode positions are bounded by the step's reach (the protocol sets it), prefill's by the context
            p + "pos": _buf([rows], "input", "i32", fill="position",
                            domain={"range": [0, "reach" if prog == "decode" else "context"]}),
            p + "cu_seqlens": _buf([{"add": ["seqs", 1]}], "input", "i32", fill="cu_seqlens",
                                   domain={"range": [0, {"add": [rows, 1]}]}),
            p + "page_table": _buf(["seqs", pages], "input", "i32",
                                   domain={"index_into": "kv", "stride": "page_tokens"}),
            p + "x": bw([rows, "hidden"]), p + "h": bw([rows, "hidden"]), p + "qkv": bw([rows, "qkv_dim"]),
            p + "attn": bw([rows, "q_dim"]), p + "attn_out": bw([rows, "hidden"]),
            p + "gate_up": bw([rows, {"mul": [2, "inter"]}]), p + "act": bw([rows, "inter"]),
            p + "mlp_out": bw([rows, "hidden"]),
            p + "part_o": bw([rows, "heads", n_splits, "head_dim"], dtype="f32"),
            p + "part_ml": bw([rows, "heads", n_splits, 2], dtype="f32"),
            p + "logits": _buf(["seqs", "vocab"], "output", "f32", fill="logits"),
            p + "argmax_val": bw(["seqs", ARGMAX_CHUNKS], dtype="f32"),
            p + "argmax_idx": bw(["seqs", ARGMAX_CHUNKS], dtype="i32"),
            p + "next": _buf(["seqs"], "output", "i32", fill="tokens"),
        })
        if decode:
            for n in ("h", "attn_out", "gate_up", "mlp_out"):
                del buffers[p + n]  # fused away: see _decode_calls
            buffers[p + "sem"] = _buf(["seqs", "kv_heads"], "carry", "i32")
            calls = _decode_calls(s, p, pages, split)
        else:
            buffers[p + "last"] = bw(["seqs", "hidden"])
            del buffers[p + "part_o"], buffers[p + "part_ml"]  # prefill_attention writes o directly
            calls = _prefill_calls(s, p, pages)
        programs[prog] = {"calls": calls, "graph": decode,
                          "batch": {"groups": "seqs", "rows": 1, "reach": "reach"} if decode
                          else {"groups": "seqs", "rows": "tokens"}}

    used = {c["op"] for prog in programs.values() for c in prog["calls"]}
    ops = {name: op for name, op in ops_cuda().items() if name in used}
    return {
        "schema_version": 1, "model": model, "target": {"device": "cuda", "arch": arch},
        "constants": {
            "hidden": s.hidden, "layers": s.layers, "heads": s.heads, "kv_heads": s.kv_heads,
            "head_dim": s.head_dim, "inter": s.inter, "vocab": s.vocab, "page_tokens": PAGE_TOKENS,
            "q_dim": {"mul": ["heads", "head_dim"]}, "kv_dim": {"mul": ["kv_heads", "head_dim"]},
            "qkv_dim": {"mul": [{"add": ["heads", {"mul": [2, "kv_heads"]}]}, "head_dim"]},
        },
        "vars": {"tokens": {"max": tokens}, "seqs": {"max": seqs}, "context": {"max": context},
                 "reach": {"max": context}},
        "buffers": buffers,
        "states": {"kv": {"bytes_per_token": {"mul": ["layers", 2, "kv_heads", "head_dim", 2]}}},
        "modules": {name: {"source": f"kernels/{name}.cubin", "sha256": ""} for name in CUBINS},
        "ops": ops, "programs": programs,
    }
