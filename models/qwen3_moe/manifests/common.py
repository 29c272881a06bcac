"""A dense llama-family manifest made sparse: each sparse layer's MLP calls replaced by a
mixture-of-experts block. What stays the llama family's (attention, norms, rope, embeddings,
LM head, sampling) is built by its own generator and left as it is; this file only finds each
sparse layer's MLP (the calls that read `gate_up_w.{l}` .. `down_w.{l}`) and puts the MoE
block's calls in their place, reading the same normed input and writing the same output.

The expert weights are bound by name from the checkpoint's per-expert tensors, one buffer a
layer for all the experts a rank holds: [gate_e; up_e] for each expert e laid end to end
(`experts_gate_up.{l}`), and down_e (`experts_down.{l}`)."""

from __future__ import annotations

from collections.abc import Callable

from ..config import MoeShape

PRE = "model.layers.{l}.mlp."


def expert_weights(s: MoeShape, l: int, dtype: str, first: int = 0, count: int | None = None) -> dict:
    """Layer l's router and the weights of experts first .. first + count - 1, as weight buffers."""
    count = s.experts if count is None else count
    pre = PRE.format(l=l)
    gate_up = [{"tensor": f"{pre}experts.{e}.{w}_proj.weight"} for e in range(first, first + count)
               for w in ("gate", "up")]
    down = [{"tensor": f"{pre}experts.{e}.down_proj.weight"} for e in range(first, first + count)]
    return {
        f"router_w.{l}": {"kind": "weight", "dtype": dtype, "shape": ["experts", "hidden"],
                          "bind": [{"tensor": pre + "gate.weight"}]},
        f"experts_gate_up.{l}": {"kind": "weight", "dtype": dtype, "bind": gate_up,
                                 "shape": [{"mul": ["local_experts", 2, "moe_inter"]}, "hidden"]},
        f"experts_down.{l}": {"kind": "weight", "dtype": dtype, "bind": down,
                              "shape": [{"mul": ["local_experts", "hidden"]}, "moe_inter"]},
    }


def _layer_of(call: dict, prefix: str) -> int | None:
    for a in call["args"]:
        buf = a.get("buf")
        if isinstance(buf, str) and buf.startswith(prefix):
            return int(buf[len(prefix):])
    return None


def make_sparse(m: dict, s: MoeShape, dtype: str, block: Callable[[str, int, dict, dict], list[dict]]) -> dict:
    """m (a dense manifest of s.dense, changed in place) with every sparse layer's MLP calls
    replaced by block(program, layer, first_mlp_call, last_mlp_call) (the calls between
    included; the first reads the normed input, the last writes the MLP's output)."""
    m["constants"].update(experts=s.experts, local_experts=s.experts, top_k=s.top_k, moe_inter=s.moe_inter)
    for l, sparse in enumerate(s.sparse):
        if sparse:
            del m["buffers"][f"gate_up_w.{l}"], m["buffers"][f"down_w.{l}"]
            m["buffers"].update(expert_weights(s, l, dtype))
    for name, prog in m["programs"].items():
        if prog.get("once"):
            continue
        calls, out, i = prog["calls"], [], 0
        while i < len(calls):
            l = _layer_of(calls[i], "gate_up_w.")
            if l is None or not s.sparse[l]:
                out.append(calls[i])
                i += 1
                continue
            j = next(j for j in range(i, len(calls)) if _layer_of(calls[j], "down_w.") == l)
            out += block(name, l, calls[i], calls[j])
            i = j + 1
        prog["calls"] = out
    prune(m)
    return m


def prune(m: dict) -> None:
    """Drop the ops, modules, workspace buffers and constants no call needs any more (the dense
    MLP's, where every layer is sparse): the verifier refuses what is declared and unused."""
    used_ops = {c["op"] for p in m["programs"].values() for c in p["calls"]}
    m["ops"] = {n: op for n, op in m["ops"].items() if n in used_ops}
    used_modules = {ln["module"] for op in m["ops"].values() for ln in op["impl"]["launches"] if "module" in ln}
    m["modules"] = {n: mod for n, mod in m["modules"].items() if n in used_modules}
    passed = {a["buf"] for p in m["programs"].values() for c in p["calls"] for a in c["args"] if "buf" in a}
    passed |= {b["of"] for b in m["buffers"].values() if "of" in b}
    m["buffers"] = {n: b for n, b in m["buffers"].items() if n in passed}
    # (an op's grid names its own parameters, not constants: a kernel's `inter` parameter is no use
    # of the constant)
    named = set(_strings([m["buffers"], m["programs"], m["states"], m["vars"],
                          [v for k, v in m["constants"].items() if k != "inter"]]))
    if "inter" not in named:
        del m["constants"]["inter"]


def _strings(x):
    """Every string value inside x (dict keys aside): the names its expressions use."""
    if isinstance(x, str):
        yield x
    elif isinstance(x, dict):
        for v in x.values():
            yield from _strings(v)
    elif isinstance(x, list):
        for v in x:
            yield from _strings(v)
