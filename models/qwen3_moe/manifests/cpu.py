"""The Qwen3-MoE manifest for the cpu target: the llama family's cpu manifest of the dense
shape (kern_models.llama.manifests.cpu), each sparse layer's MLP made a MoE block of four calls
(common.py): the router's logits, route, experts, combine (kernels/cpu/kernels.py says what each
does)."""

from __future__ import annotations

from kern_models.llama.manifests import cpu as dense
from kern_models.common.manifest_parts import buffer_arg, value_arg

from ..config import MoeShape
from .common import make_sparse

F = "f32"
MODULE = "moe"  # the module of cpu/kernels.py in the manifest


def ops() -> dict:
    def op(entry, *params):
        return {"params": list(params), "impl": {"launches": [{"module": MODULE, "entry": entry}]}}

    return {
        "moe_route": op("route", "logits: in buffer<f32>", "ids: out buffer<i32>", "weights: out buffer<f32>",
                        "norm_topk: i32"),
        "moe_experts": op("experts", "x: in buffer<f32>", "ids: in buffer<i32>", "gate_up: in buffer<f32>",
                          "down: in buffer<f32>", "y: out buffer<f32>", "first: i32", "count: i32"),
        "moe_combine": op("combine", "y: in buffer<f32>", "weights: in buffer<f32>", "out: out buffer<f32>"),
    }


def route_buffers(m: dict, p: str, rows) -> None:
    """A program's scratch of the MoE block: router logits, the chosen experts and weights, and
    each (row, choice)'s expert output."""
    ws = lambda shape, dtype=F: {"kind": "workspace", "dtype": dtype, "shape": shape}
    m["buffers"].update({p + "router": ws([rows, "experts"]), p + "topk_ids": ws([rows, "top_k"], "i32"),
                         p + "topk_w": ws([rows, "top_k"]), p + "expert_out": ws([rows, "top_k", "hidden"])})


def build(s: MoeShape, model: str, **limits) -> dict:
    m = dense.build(s.dense, model, **limits)
    m["ops"].update(ops())

    def block(prog: str, l: int, first: dict, last: dict) -> list[dict]:
        h, out = first["args"][0], last["args"][2]
        p = h["buf"].split("_", 1)[0] + "_"
        route_buffers(m, p, m["buffers"][h["buf"]]["shape"][0])
        return [
            {"op": "linear", "args": [h, buffer_arg(f"router_w.{l}"), buffer_arg(p + "router")]},
            {"op": "moe_route", "args": [buffer_arg(p + "router"), buffer_arg(p + "topk_ids"), buffer_arg(p + "topk_w"), value_arg(int(s.norm_topk))]},
            {"op": "moe_experts", "args": [h, buffer_arg(p + "topk_ids"), buffer_arg(f"experts_gate_up.{l}"), buffer_arg(f"experts_down.{l}"),
                                           buffer_arg(p + "expert_out"), value_arg(0), value_arg("local_experts")]},
            {"op": "moe_combine", "args": [buffer_arg(p + "expert_out"), buffer_arg(p + "topk_w"), out]},
        ]

    m["modules"][MODULE] = {"source": "kernels/qwen3_moe_cpu.py", "sha256": ""}
    return make_sparse(m, s, F, block)
