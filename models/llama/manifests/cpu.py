"""The llama family's manifest for the cpu target (fp32 compute from the checkpoint's weights).

Layers are unrolled into calls. Three stepping programs share the weights, the rope table and
the paged KV state: `prefill` (several sequences, ragged rows with cu_seqlens, logits of each
sequence's last row), `decode` (one row per sequence) and `verify_round` (a speculative round: ragged
rows like prefill, a token drawn at every row and each sequence's accepted count). A row costs
the same arithmetic in all three (every kernel reduces a row alone), so a verify row's token is
the one a decode step would draw."""

from __future__ import annotations

from ..config import Shape
from kern_models.common.manifest_parts import MASK_ROWS, buffer, buffer_arg, context_of, program_batch, sampling_args, sampling_inputs, tokens_of, value_arg

from .common import PAGE_TOKENS, weight_buffers

F = "f32"


def ops_cpu() -> dict:
    def op(*params, entry=None, name=None):
        return {"params": list(params), "impl": {"launches": [{"module": "kernels", "entry": entry or name}]}}

    attn_scalars = ("layer: i32", "layers: i32", "heads: i32", "kv_heads: i32", "head_dim: i32", "page_tokens: i32")
    table = {
        "embed": ("ids: in buffer<i32>", "table: in buffer<f32>", "x: out buffer<f32>"),
        "rms_norm": ("x: in buffer<f32>", "w: in buffer<f32>", "y: out buffer<f32>", "eps: f32"),
        "add_rms_norm": ("res: inout buffer<f32>", "x: in buffer<f32>", "w: in buffer<f32>",
                         "y: out buffer<f32>", "eps: f32"),
        "head_rms_norm": ("qkv: inout buffer<f32>", "qw: in buffer<f32>", "kw: in buffer<f32>",
                          "heads: i32", "kv_heads: i32", "head_dim: i32", "eps: f32"),
        "linear": ("x: in buffer<f32>", "w: in buffer<f32>", "y: out buffer<f32>"),
        "rope_table": ("table: out buffer<f32>", "theta: f32", "factor: f32", "low_freq_factor: f32",
                       "high_freq_factor: f32", "original_max_pos: i32"),
        "rope": ("qkv: inout buffer<f32>", "pos: in buffer<i32>", "table: in buffer<f32>",
                 "heads: i32", "kv_heads: i32", "head_dim: i32"),
        "kv_append": ("qkv: in buffer<f32>", "kv: inout state", "page_table: in buffer<i32>",
                      "cu_seqlens: in buffer<i32>", "pos: in buffer<i32>", *attn_scalars),
        "kv_append_decode": ("qkv: in buffer<f32>", "kv: inout state", "page_table: in buffer<i32>",
                             "pos: in buffer<i32>", *attn_scalars),
        "attention": ("qkv: in buffer<f32>", "kv: in state", "page_table: in buffer<i32>",
                      "cu_seqlens: in buffer<i32>", "pos: in buffer<i32>", "o: out buffer<f32>", *attn_scalars),
        "attention_decode": ("qkv: in buffer<f32>", "kv: in state", "page_table: in buffer<i32>",
                             "pos: in buffer<i32>", "o: out buffer<f32>", *attn_scalars),
        "silu_mul": ("gate_up: in buffer<f32>", "h: out buffer<f32>"),
        "gather_last": ("x: in buffer<f32>", "cu_seqlens: in buffer<i32>", "y: out buffer<f32>"),
        "sample": ("logits: in buffer<f32>", "temperature: in buffer<f32>", "key: in buffer<i32>",
                   "mask: in buffer<i32>", "mask_row: in buffer<i32>", "tokens: out buffer<i32>"),
        "accept": ("ids: in buffer<i32>", "cu_seqlens: in buffer<i32>", "tokens: in buffer<i32>",
                   "accepted: out buffer<i32>"),
    }
    return {name: op(*params, name=name) for name, params in table.items()}


def head_calls(p: str, decode: bool, eps: float, verify: bool = False) -> list[dict]:
    """After the last layer: the final norm (adding the last MLP's output into the residual),
    each sequence's last row (prefill), the LM head and sampling; a verify program samples
    every row and then accepts each sequence's longest proposed prefix that matches."""
    calls = [{"op": "add_rms_norm", "args": [buffer_arg(p + "x"), buffer_arg(p + "mlp_out"), buffer_arg("final_norm"), buffer_arg(p + "h"), value_arg(eps)]}]
    last = p + "h"
    if verify:
        return calls + [
            {"op": "linear", "args": [buffer_arg(last), buffer_arg("lm_head"), buffer_arg(p + "logits")]},
            {"op": "sample", "args": [buffer_arg(p + "logits"), *sampling_args(p), buffer_arg(p + "next")]},
            {"op": "accept", "args": [buffer_arg(p + "ids"), buffer_arg(p + "cu_seqlens"), buffer_arg(p + "next"), buffer_arg(p + "accepted")]}]
    if not decode:
        calls.append({"op": "gather_last", "args": [buffer_arg(p + "h"), buffer_arg(p + "cu_seqlens"), buffer_arg(p + "last")]})
        last = p + "last"
    return calls + [{"op": "linear", "args": [buffer_arg(last), buffer_arg("lm_head"), buffer_arg(p + "logits")]},
                    {"op": "sample", "args": [buffer_arg(p + "logits"), *sampling_args(p), buffer_arg(p + "next")]}]


def stepping_program(calls: list[dict], decode: bool) -> dict:
    """decode steps one row a sequence (its reach bucketed), prefill ragged rows."""
    return {"calls": calls, "batch": program_batch("seqs", "tokens", decode)}


def build(s: Shape, model: str, *, tokens: int = 256, seqs: int = 32, context: int | None = None) -> dict:
    context = context_of(s, context)
    tokens = tokens_of(tokens)
    pages = {"ceil_div": ["context", "page_tokens"]}
    qkv_dim = s.q_dim + 2 * s.kv_dim
    buffers: dict = {"rope": buffer(["context", "head_dim"], "carry"), **weight_buffers(s, F)}

    programs: dict = {
        "rope_init": {"once": True, "calls": [{"op": "rope_table", "args": [
            buffer_arg("rope"), value_arg(s.theta), value_arg(s.rope_factor), value_arg(s.rope_low), value_arg(s.rope_high), value_arg(s.rope_orig_max)]}]},
    }
    for prog, rows in (("prefill", "tokens"), ("decode", "seqs"), ("verify_round", "tokens")):
        p = prog[0] + "_"
        decode, verify = prog == "decode", prog == "verify_round"
        per = rows if verify else "seqs"  # what a token is drawn for: each sequence, or each row
        buffers.update({
            p + "ids": buffer([rows], "input", "i32", fill="token", domain={"range": [0, "vocab"]}),
            # decode positions are bounded by the step's reach (the protocol sets it), prefill's by the context
            p + "pos": buffer([rows], "input", "i32", fill="position",
                            domain={"range": [0, "reach" if prog == "decode" else "context"]}),
            p + "page_table": buffer(["seqs", pages], "input", "i32",
                                   domain={"index_into": "kv", "stride": "page_tokens"}),
            p + "x": buffer([rows, "hidden"]),
            p + "h": buffer([rows, "hidden"]),
            p + "qkv": buffer([rows, "qkv_dim"]),
            p + "attn": buffer([rows, "q_dim"]),
            p + "attn_out": buffer([rows, "hidden"]),
            p + "gate_up": buffer([rows, {"mul": [2, "inter"]}]),
            p + "act": buffer([rows, "inter"]),
            p + "mlp_out": buffer([rows, "hidden"]),
            # a verify program's logits are a row each (a round reads only its tokens and accepted
            # counts; kern test compares the logits)
            p + "logits": buffer([per, "vocab"], "output", fill="logits"),
            p + "next": buffer([per], "output", "i32", fill="tokens"),
            **sampling_inputs(p, per),
        })
        if verify:
            buffers[p + "accepted"] = buffer(["seqs"], "output", "i32", fill="accepted")
        if not decode:
            buffers[p + "cu_seqlens"] = buffer([{"add": ["seqs", 1]}], "input", "i32", fill="cu_seqlens",
                                             domain={"range": [0, {"add": ["tokens", 1]}]})
            if not verify:
                buffers[p + "last"] = buffer(["seqs", "hidden"])
        attn_scalars = lambda l: [value_arg(l), value_arg("layers"), value_arg("heads"), value_arg("kv_heads"), value_arg("head_dim"), value_arg("page_tokens")]
        kv = {"state": "kv"}
        calls = [{"op": "embed", "args": [buffer_arg(p + "ids"), buffer_arg("embed"), buffer_arg(p + "x")]}]
        for l in range(s.layers):
            if l == 0:
                calls.append({"op": "rms_norm", "args": [buffer_arg(p + "x"), buffer_arg("ln1.0"), buffer_arg(p + "h"), value_arg(s.eps)]})
            else:
                calls.append({"op": "add_rms_norm", "args": [buffer_arg(p + "x"), buffer_arg(p + "mlp_out"), buffer_arg(f"ln1.{l}"),
                                                             buffer_arg(p + "h"), value_arg(s.eps)]})
            calls.append({"op": "linear", "args": [buffer_arg(p + "h"), buffer_arg(f"qkv_w.{l}"), buffer_arg(p + "qkv")]})
            if s.qk_norm:
                calls.append({"op": "head_rms_norm", "args": [buffer_arg(p + "qkv"), buffer_arg(f"q_norm.{l}"), buffer_arg(f"k_norm.{l}"),
                                                              value_arg("heads"), value_arg("kv_heads"), value_arg("head_dim"), value_arg(s.eps)]})
            calls.append({"op": "rope", "args": [buffer_arg(p + "qkv"), buffer_arg(p + "pos"), buffer_arg("rope"),
                                                 value_arg("heads"), value_arg("kv_heads"), value_arg("head_dim")]})
            if decode:
                calls.append({"op": "kv_append_decode", "args": [buffer_arg(p + "qkv"), kv, buffer_arg(p + "page_table"),
                                                                 buffer_arg(p + "pos"), *attn_scalars(l)]})
                calls.append({"op": "attention_decode", "args": [buffer_arg(p + "qkv"), kv, buffer_arg(p + "page_table"),
                                                                 buffer_arg(p + "pos"), buffer_arg(p + "attn"), *attn_scalars(l)]})
            else:
                calls.append({"op": "kv_append", "args": [buffer_arg(p + "qkv"), kv, buffer_arg(p + "page_table"),
                                                          buffer_arg(p + "cu_seqlens"), buffer_arg(p + "pos"), *attn_scalars(l)]})
                calls.append({"op": "attention", "args": [buffer_arg(p + "qkv"), kv, buffer_arg(p + "page_table"),
                                                          buffer_arg(p + "cu_seqlens"), buffer_arg(p + "pos"), buffer_arg(p + "attn"),
                                                          *attn_scalars(l)]})
            calls.append({"op": "linear", "args": [buffer_arg(p + "attn"), buffer_arg(f"o_w.{l}"), buffer_arg(p + "attn_out")]})
            calls.append({"op": "add_rms_norm", "args": [buffer_arg(p + "x"), buffer_arg(p + "attn_out"), buffer_arg(f"ln2.{l}"),
                                                         buffer_arg(p + "h"), value_arg(s.eps)]})
            calls.append({"op": "linear", "args": [buffer_arg(p + "h"), buffer_arg(f"gate_up_w.{l}"), buffer_arg(p + "gate_up")]})
            calls.append({"op": "silu_mul", "args": [buffer_arg(p + "gate_up"), buffer_arg(p + "act")]})
            calls.append({"op": "linear", "args": [buffer_arg(p + "act"), buffer_arg(f"down_w.{l}"), buffer_arg(p + "mlp_out")]})
        programs[prog] = stepping_program(calls + head_calls(p, decode, s.eps, verify), decode)

    ops = ops_cpu()
    if not s.qk_norm:
        del ops["head_rms_norm"]
    return {
        "schema_version": 1,
        "model": model,
        "target": {"device": "cpu"},
        "constants": {
            "hidden": s.hidden, "layers": s.layers, "heads": s.heads, "kv_heads": s.kv_heads,
            "head_dim": s.head_dim, "inter": s.inter, "vocab": s.vocab, "page_tokens": PAGE_TOKENS,
            "q_dim": {"mul": ["heads", "head_dim"]},
            "qkv_dim": {"mul": [{"add": ["heads", {"mul": [2, "kv_heads"]}]}, "head_dim"]},
        },
        "vars": {"tokens": {"max": tokens}, "seqs": {"max": seqs}, "context": {"max": context},
                 "reach": {"max": context}, MASK_ROWS: {"max": seqs}},
        "buffers": buffers,
        "states": {"kv": {"bytes_per_token": {"mul": ["layers", 2, "kv_heads", "head_dim", 4]}}},
        "modules": {"kernels": {"source": "kernels/llama_cpu.py", "sha256": ""}},
        "ops": ops,
        "programs": programs,
    }
