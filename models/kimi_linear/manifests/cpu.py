"""The Kimi-Linear manifest for the cpu target (fp32 compute from the checkpoint's weights).

Layers are unrolled into calls. `prefill` (several sequences, ragged rows with cu_seqlens,
logits of each sequence's last row) and `decode` (one row a sequence) share the weights and
both states: `kv` (MLA's latent cache, paged) and `kda` (the KDA recurrence and convolution
window, a slot a sequence: the `slot` role). Norms, projections, SwiGLU, sampling are the
llama module's; the experts and their weighted sum the Qwen3-MoE module's; the KDA, MLA and
router kernels this family's (kernels/cpu/kernels.py)."""

from __future__ import annotations

from pathlib import Path

from kern_models.common.errors import ConfigError
from kern_models.common.manifest_parts import MASK_ROWS, buffer, buffer_arg, context_of, sampling_inputs, tokens_of, value_arg
from kern_models.llama.manifests.cpu import head_calls, ops_cpu as llama_ops, stepping_program
from kern_models.qwen3_moe.manifests.cpu import MODULE as MOE_MODULE, ops as moe_ops

from ..config import KDA, KimiShape
from .common import constants, prompt_keys, state_constants, states, weight_buffers

F = "f32"
MODULE = "kimi"
# The prompt's recurrence: "tokens" (the default) runs it a token at a time through decode's
# step, so a request's bytes do not depend on where its prompt was cut, on a cache hit or on
# the batch (docs/determinism.md); "chunked" is the chunk-by-chunk form sm_90a's prefill
# kernel computes, faster on long prompts, whose bits depend on the cut (docs/perf.md has both).
# The op keeps its name, kda_chunked, in either: kern test pairs it with sm_90a's.
KDA_FORMS = ("tokens", "chunked")
KDA_CHUNK = 16  # the chunked form's chunk: small, so CI's short prompts cross chunks
HERE = Path(__file__).resolve().parent.parent
MODULES = {  # module -> (file in the deployment's kernels/, source)
    "kernels": ("llama_cpu.py", HERE.parent / "llama" / "kernels" / "cpu" / "kernels.py"),
    MOE_MODULE: ("qwen3_moe_cpu.py", HERE.parent / "qwen3_moe" / "kernels" / "cpu" / "kernels.py"),
    MODULE: ("kimi_linear_cpu.py", HERE / "kernels" / "cpu" / "kernels.py"),
}


def ops(kda_form: str = "tokens") -> dict:
    def op(entry, *params):
        return {"params": list(params), "impl": {"launches": [{"module": MODULE, "entry": entry}]}}

    kda = ("layer: i32", "layers: i32", "heads: i32", "dim: i32", "conv: i32", "slot_bytes: i32")
    mla = ("layer: i32", "layers: i32", "heads: i32", "nope: i32", "rope: i32", "v_dim: i32", "kv_lora: i32",
           "page_tokens: i32", "token_bytes: i32")
    append = ("layer: i32", "layers: i32", "kv_lora: i32", "rope: i32", "page_tokens: i32", "token_bytes: i32",
              "eps: f32")
    fb, ib, st = "in buffer<f32>", "in buffer<i32>", "inout state"
    return {
        "kda_conv": op("kda_conv", "mix: inout buffer<f32>", "w: " + fb, "state: " + st, "slot: " + ib,
                       "cu_seqlens: " + ib, "pos: " + ib, *kda),
        "kda_conv_decode": op("kda_conv_decode", "mix: inout buffer<f32>", "w: " + fb, "state: " + st,
                              "slot: " + ib, "pos: " + ib, *kda),
        "kda_gate": op("kda_gate", "f: inout buffer<f32>", "a_log: " + fb, "dt_bias: " + fb, "heads: i32"),
        "kda_chunked": op("kda_" + kda_form, "mix: " + fb, "g: " + fb, "b: " + fb, "state: " + st, "slot: " + ib,
                          "cu_seqlens: " + ib, "pos: " + ib, "o: out buffer<f32>", *kda,
                          *(["chunk: i32"] if kda_form == "chunked" else [])),
        "kda_step": op("kda_step", "mix: " + fb, "g: " + fb, "b: " + fb, "state: " + st, "slot: " + ib,
                       "pos: " + ib, "o: out buffer<f32>", *kda),
        "kda_out_norm": op("kda_out_norm", "o: " + fb, "gate: " + fb, "w: " + fb, "y: out buffer<f32>",
                           "heads: i32", "eps: f32"),
        "mla_append": op("mla_append", "ckv: " + fb, "norm_w: " + fb, "kv: " + st, "page_table: " + ib,
                         "cu_seqlens: " + ib, "pos: " + ib, *append),
        "mla_append_decode": op("mla_append_decode", "ckv: " + fb, "norm_w: " + fb, "kv: " + st,
                                "page_table: " + ib, "pos: " + ib, *append),
        "mla_attention": op("mla_attention", "q: " + fb, "kv: in state", "page_table: " + ib, "cu_seqlens: " + ib,
                            "pos: " + ib, "prompt_len: " + ib, "kv_b: " + fb, "o: out buffer<f32>", *mla),
        "mla_attention_decode": op("mla_attention_decode", "q: " + fb, "kv: in state", "page_table: " + ib,
                                   "pos: " + ib, "kv_b: " + fb, "o: out buffer<f32>", *mla),
        "kimi_route": op("route", "logits: " + fb, "bias: " + fb, "ids: out buffer<i32>", "weights: out buffer<f32>",
                         "scaling: f32", "norm_topk: i32", "groups: i32", "topk_groups: i32"),
        "add": op("add", "x: inout buffer<f32>", "y: " + fb),
    }


def _buffers(s: KimiShape, p: str, rows, decode: bool) -> dict:
    ws = lambda *shape: buffer(list(shape))
    out = {
        p + "ids": buffer([rows], "input", "i32", fill="token", domain={"range": [0, "vocab"]}),
        p + "pos": buffer([rows], "input", "i32", fill="position",
                       domain={"range": [0, "reach" if decode else "context"]}),
        p + "x": ws(rows, "hidden"), p + "h": ws(rows, "hidden"), p + "attn_out": ws(rows, "hidden"),
        p + "mlp_out": ws(rows, "hidden"),
        p + "logits": buffer(["seqs", "vocab"], "output", fill="logits"),
        p + "next": buffer(["seqs"], "output", "i32", fill="tokens"),
        **sampling_inputs(p, "seqs"),
    }
    if s.kda_layers:
        out |= {p + "slot": buffer(["seqs"], "input", "i32", fill="slot"),
                p + "mix": ws(rows, {"mul": [3, "qkv"]}), p + "low": ws(rows, "kda_dim"), p + "g": ws(rows, "qkv"),
                p + "beta": ws(rows, "kda_heads"), p + "gate": ws(rows, "qkv"), p + "core": ws(rows, "qkv"),
                p + "normed": ws(rows, "qkv")}
    if s.mla_layers:
        pages = {"ceil_div": ["context", "page_tokens"]}
        out |= {p + "page_table": buffer(["seqs", pages], "input", "i32",
                                      domain={"index_into": "kv", "stride": "page_tokens"}),
                p + "q": ws(rows, "q_dim"), p + "ckv": ws(rows, "latent"),
                p + "attn": ws(rows, {"mul": ["heads", "v_dim"]})}
        if not decode:  # a prompt token attends in the expanded form, a generated one absorbed (kernels.mla_attention)
            out[p + "prompt_len"] = buffer(["seqs"], "input", "i32", fill="prompt_len")
        if s.q_lora is not None:
            out |= {p + "q_low": ws(rows, "q_lora"), p + "q_normed": ws(rows, "q_lora")}
    if any(s.sparse):
        out |= {p + "router": ws(rows, "experts"), p + "topk_ids": buffer([rows, "top_k"], dtype="i32"),
                p + "topk_w": ws(rows, "top_k"), p + "expert_out": ws(rows, "top_k", "hidden"),
                p + "shared_gu": ws(rows, {"mul": [2, "shared_inter"]}), p + "shared_act": ws(rows, "shared_inter"),
                p + "shared_out": ws(rows, "hidden")}
    if not all(s.sparse):
        out |= {p + "gate_up": ws(rows, {"mul": [2, "inter"]}), p + "act": ws(rows, "inter")}
    if not decode:
        out[p + "cu_seqlens"] = buffer([{"add": ["seqs", 1]}], "input", "i32", fill="cu_seqlens",
                                    domain={"range": [0, {"add": ["tokens", 1]}]})
        out[p + "last"] = buffer(["seqs", "hidden"])
    return out


def _kda(s: KimiShape, p: str, l: int, decode: bool, kda_form: str) -> list[dict]:
    k = s.kda_layers.index(l)
    geo = [value_arg(k), value_arg("kda_layers"), value_arg("kda_heads"), value_arg("kda_dim"), value_arg("conv"), value_arg("kda_slot_bytes")]
    kda, where = {"state": "kda"}, [buffer_arg(p + "slot")] + ([] if decode else [buffer_arg(p + "cu_seqlens")]) + [buffer_arg(p + "pos")]
    lin = lambda x, w, y: {"op": "linear", "args": [buffer_arg(p + x), buffer_arg(w), buffer_arg(p + y)]}
    return [
        lin("h", f"kda_qkv_w.{l}", "mix"),
        {"op": "kda_conv_decode" if decode else "kda_conv", "args": [buffer_arg(p + "mix"), buffer_arg(f"kda_conv_w.{l}"), kda,
                                                                      *where, *geo]},
        lin("h", f"kda_fa_w.{l}", "low"), lin("low", f"kda_fb_w.{l}", "g"),
        {"op": "kda_gate", "args": [buffer_arg(p + "g"), buffer_arg(f"kda_a_log.{l}"), buffer_arg(f"kda_dt_bias.{l}"), value_arg("kda_heads")]},
        lin("h", f"kda_b_w.{l}", "beta"),
        {"op": "kda_step" if decode else "kda_chunked",
         "args": [buffer_arg(p + "mix"), buffer_arg(p + "g"), buffer_arg(p + "beta"), kda, *where, buffer_arg(p + "core"), *geo]
         + ([value_arg(KDA_CHUNK)] if not decode and kda_form == "chunked" else [])},
        lin("h", f"kda_ga_w.{l}", "low"), lin("low", f"kda_gb_w.{l}", "gate"),
        {"op": "kda_out_norm", "args": [buffer_arg(p + "core"), buffer_arg(p + "gate"), buffer_arg(f"kda_o_norm.{l}"), buffer_arg(p + "normed"),
                                        value_arg("kda_heads"), value_arg(s.eps)]},
        lin("normed", f"o_w.{l}", "attn_out"),
    ]


def _mla(s: KimiShape, p: str, l: int, decode: bool) -> list[dict]:
    k = s.mla_layers.index(l)
    kv, table = {"state": "kv"}, [buffer_arg(p + "page_table")] + ([] if decode else [buffer_arg(p + "cu_seqlens")]) + [buffer_arg(p + "pos")]
    lin = lambda x, w, y: {"op": "linear", "args": [buffer_arg(p + x), buffer_arg(w), buffer_arg(p + y)]}
    q = [lin("h", f"q_w.{l}", "q")] if s.q_lora is None else [
        lin("h", f"q_a_w.{l}", "q_low"),
        {"op": "rms_norm", "args": [buffer_arg(p + "q_low"), buffer_arg(f"q_a_norm.{l}"), buffer_arg(p + "q_normed"), value_arg(s.eps)]},
        lin("q_normed", f"q_b_w.{l}", "q")]
    return [
        *q, lin("h", f"kv_a_w.{l}", "ckv"),
        {"op": "mla_append_decode" if decode else "mla_append",
         "args": [buffer_arg(p + "ckv"), buffer_arg(f"kv_a_norm.{l}"), kv, *table, value_arg(k), value_arg("mla_layers"), value_arg("kv_lora"), value_arg("rope"),
                  value_arg("page_tokens"), value_arg("kv_token_bytes"), value_arg(s.eps)]},
        {"op": "mla_attention_decode" if decode else "mla_attention",
         "args": [buffer_arg(p + "q"), kv, *table, *([] if decode else [buffer_arg(p + "prompt_len")]), buffer_arg(f"kv_b_w.{l}"), buffer_arg(p + "attn"), value_arg(k), value_arg("mla_layers"), value_arg("heads"),
                  value_arg("nope"), value_arg("rope"), value_arg("v_dim"), value_arg("kv_lora"), value_arg("page_tokens"), value_arg("kv_token_bytes")]},
        lin("attn", f"o_w.{l}", "attn_out"),
    ]


def _mlp(s: KimiShape, p: str, l: int) -> list[dict]:
    lin = lambda x, w, y: {"op": "linear", "args": [buffer_arg(p + x), buffer_arg(w), buffer_arg(p + y)]}
    if not s.sparse[l]:
        return [lin("h", f"gate_up_w.{l}", "gate_up"), {"op": "silu_mul", "args": [buffer_arg(p + "gate_up"), buffer_arg(p + "act")]},
                lin("act", f"down_w.{l}", "mlp_out")]
    return [
        lin("h", f"router_w.{l}", "router"),
        {"op": "kimi_route", "args": [buffer_arg(p + "router"), buffer_arg(f"router_bias.{l}"), buffer_arg(p + "topk_ids"), buffer_arg(p + "topk_w"),
                                      value_arg(s.scaling), value_arg(int(s.norm_topk)), value_arg(s.groups), value_arg(s.topk_groups)]},
        {"op": "moe_experts", "args": [buffer_arg(p + "h"), buffer_arg(p + "topk_ids"), buffer_arg(f"experts_gate_up.{l}"),
                                       buffer_arg(f"experts_down.{l}"), buffer_arg(p + "expert_out"), value_arg(0), value_arg("local_experts")]},
        {"op": "moe_combine", "args": [buffer_arg(p + "expert_out"), buffer_arg(p + "topk_w"), buffer_arg(p + "mlp_out")]},
        lin("h", f"shared_gate_up.{l}", "shared_gu"),
        {"op": "silu_mul", "args": [buffer_arg(p + "shared_gu"), buffer_arg(p + "shared_act")]},
        lin("shared_act", f"shared_down.{l}", "shared_out"),
        {"op": "add", "args": [buffer_arg(p + "mlp_out"), buffer_arg(p + "shared_out")]},
    ]


def build(s: KimiShape, model: str, *, tokens: int = 256, seqs: int = 32, context: int | None = None,
          kda_form: str = "tokens") -> dict:
    if kda_form not in KDA_FORMS:
        raise ConfigError(f"kda_form {kda_form!r}: the cpu recurrence's prompt form is one of {', '.join(KDA_FORMS)}")
    context = context_of(s, context)
    tokens = tokens_of(tokens)
    buffers: dict = weight_buffers(s, F)
    programs: dict = {}
    for prog, rows in (("prefill", "tokens"), ("decode", "seqs")):
        p, decode = prog[0] + "_", prog == "decode"
        buffers |= _buffers(s, p, rows, decode)
        calls = [{"op": "embed", "args": [buffer_arg(p + "ids"), buffer_arg("embed"), buffer_arg(p + "x")]}]
        for l in range(s.layers):
            calls.append({"op": "rms_norm", "args": [buffer_arg(p + "x"), buffer_arg("ln1.0"), buffer_arg(p + "h"), value_arg(s.eps)]} if l == 0 else
                         {"op": "add_rms_norm", "args": [buffer_arg(p + "x"), buffer_arg(p + "mlp_out"), buffer_arg(f"ln1.{l}"), buffer_arg(p + "h"),
                                                         value_arg(s.eps)]})
            calls += _kda(s, p, l, decode, kda_form) if s.mixers[l] == KDA else _mla(s, p, l, decode)
            calls.append({"op": "add_rms_norm", "args": [buffer_arg(p + "x"), buffer_arg(p + "attn_out"), buffer_arg(f"ln2.{l}"), buffer_arg(p + "h"),
                                                         value_arg(s.eps)]})
            calls += _mlp(s, p, l)
        programs[prog] = stepping_program(calls + head_calls(p, decode, s.eps), decode)
        if not decode and s.mla_layers:
            programs[prog]["batch"]["keys"] = "keys"  # as the sm_90a build's (manifests/common.py prompt_keys)
    used = {c["op"] for prog in programs.values() for c in prog["calls"]}
    all_ops = {**llama_ops(), **moe_ops(), **ops(kda_form)}
    return {
        "schema_version": 1, "model": model, "target": {"device": "cpu"},
        "constants": {**constants(s), **state_constants(s, 4)},
        "vars": {"tokens": {"max": tokens}, "seqs": {"max": seqs}, "context": {"max": context},
                 "reach": {"max": context}, MASK_ROWS: {"max": seqs},
                 **({"keys": {"max": prompt_keys(s, context, tokens)}} if s.mla_layers else {})},
        "buffers": buffers,
        "states": states(s),
        "modules": {name: {"source": f"kernels/{file}", "sha256": ""} for name, (file, _) in MODULES.items()},
        "ops": {n: op for n, op in all_ops.items() if n in used},
        "programs": programs,
    }
