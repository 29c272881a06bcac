"""A cpu candidate whose programs (prefill, decode and the speculative round's verify program)
differ from the reference's in their fusion, as the sm_90a deployment's do: per layer the norm, qkv projection and rope are one call, each projection
adds into the residual stream itself (no separate residual add fused with the next norm), and
the MLP's norm, gate/up projection and activation are one call. Every op points at a module of
its own (the cpu kernels with the fused functions appended), so no call of the layers matches
the reference's and the diff sees one span a program, as it does for sm_90a against cpu.

Its arithmetic is the reference's, composed: a faithful candidate. The planted bugs of the
issue are manifest edits of it: two layers' o_proj weights swapped, or a layer's post-attention
norm bound to its pre-attention norm's weight."""

from __future__ import annotations

import json
from pathlib import Path

from .planted import _bufs, _calls, _sha, variant

FUSED_MODULE = """

# ---- fused ops (tests/judge/fused.py): the kernels above composed, as a GPU build fuses its calls


def norm_qkv_rope(x, w, qkv_w, qkv, pos, table, eps, heads, kv_heads, head_dim):
    h = np.empty_like(x)
    rms_norm(x, w, h, eps)
    linear(h, qkv_w, qkv)
    rope(qkv, pos, table, heads, kv_heads, head_dim)


def linear_residual(a, w, x):
    y = np.empty((a.shape[0], w.shape[0]), np.float32)
    linear(a, w, y)
    x += y


def norm_swiglu(x, w, gate_up_w, act, eps):
    h = np.empty_like(x)
    rms_norm(x, w, h, eps)
    gate_up = np.empty((x.shape[0], gate_up_w.shape[0]), np.float32)
    linear(h, gate_up_w, gate_up)
    silu_mul(gate_up, act)
"""

NEW_OPS = {
    "norm_qkv_rope": ["x: in buffer<f32>", "w: in buffer<f32>", "qkv_w: in buffer<f32>", "qkv: out buffer<f32>",
                      "pos: in buffer<i32>", "table: in buffer<f32>", "eps: f32", "heads: i32", "kv_heads: i32",
                      "head_dim: i32"],
    "linear_residual": ["a: in buffer<f32>", "w: in buffer<f32>", "x: inout buffer<f32>"],
    "norm_swiglu": ["x: in buffer<f32>", "w: in buffer<f32>", "gate_up_w: in buffer<f32>", "act: out buffer<f32>",
                    "eps: f32"],
}
LAYER = 10  # the reference's calls a layer: norm, qkv, rope, kv append, attention, o, add+norm, gate/up, act, down


def _fuse(calls: list[dict]) -> list[dict]:
    """The reference's program, fused: [embed] + layers + its tail (final norm onwards)."""
    out, k = [calls[0]], 1
    while calls[k]["op"] in ("rms_norm", "add_rms_norm") and k + LAYER < len(calls) and \
            calls[k + 1]["op"] == "linear" and calls[k + 2]["op"] == "rope":
        norm, qkv, rope, kv, att, o, norm2, gate_up, act, down = calls[k:k + LAYER]
        x, w, eps = norm["args"][0], norm["args"][-3], norm["args"][-1]
        out += [{"op": "norm_qkv_rope", "args": [x, w, qkv["args"][1], qkv["args"][2], *rope["args"][1:3], eps,
                                                  *rope["args"][3:]]},
                kv, att,
                {"op": "linear_residual", "args": [o["args"][0], o["args"][1], x]},
                {"op": "norm_swiglu", "args": [x, norm2["args"][2], gate_up["args"][1], act["args"][1], eps]},
                {"op": "linear_residual", "args": [down["args"][0], down["args"][1], x]}]
        k += LAYER
    final = calls[k]  # add_rms_norm(x, mlp_out, final_norm, h, eps): the residual is in x already
    out.append({"op": "rms_norm", "args": [final["args"][0], *final["args"][2:]]})
    return out + calls[k + 1:]


def fused(base: Path, out: Path) -> Path:
    def edit(m):
        for prog in ("prefill", "decode", "verify_round"):
            m["programs"][prog]["calls"] = _fuse(_calls(m, prog))
        for name, params in NEW_OPS.items():
            m["ops"][name] = {"params": params, "impl": {"launches": [{"module": "kernels", "entry": name}]}}
        used = {c["op"] for p in m["programs"].values() for c in p["calls"]}
        m["ops"] = {n: op for n, op in m["ops"].items() if n in used}
        bufs = {a["buf"] for p in m["programs"].values() for c in p["calls"] for a in c["args"] if "buf" in a}
        m["buffers"] = {n: b for n, b in m["buffers"].items() if n in bufs}
    v = variant(base, out, edit)
    m = json.loads((v / "manifest.json").read_text())
    src = v / m["modules"]["kernels"]["source"]
    mod = v / "kernels" / "fused.py"  # a module of its own: no op keeps the reference's implementation
    mod.write_text(src.read_text() + FUSED_MODULE)
    m["modules"] = {"fused": {"source": "kernels/fused.py", "sha256": _sha(mod)}}
    for op in m["ops"].values():
        for launch in op["impl"]["launches"]:
            launch["module"] = "fused"
    (v / "manifest.json").write_text(json.dumps(m, indent=1))
    return v


def o_proj_swapped(fused_dir: Path, out: Path, layers: tuple[int, int] = (3, 4)) -> Path:
    """Two layers' attention output projections bound to each other's weights."""
    a, b = (f"o_w.{i}" for i in layers)

    def edit(m):
        for prog in ("prefill", "decode"):
            for c in _calls(m, prog):
                if c["op"] == "linear_residual" and _bufs(c)[1] in (a, b):
                    c["args"][1] = {"buf": b if _bufs(c)[1] == a else a}
    return variant(fused_dir, out, edit)


def post_norm_is_pre_norm(fused_dir: Path, out: Path, layer: int = 7) -> Path:
    """A layer's post-attention norm weight bound to the checkpoint's pre-attention norm."""
    def edit(m):
        m["buffers"][f"ln2.{layer}"]["bind"] = [dict(seg) for seg in m["buffers"][f"ln1.{layer}"]["bind"]]
    return variant(fused_dir, out, edit)
