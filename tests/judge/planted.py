"""Planted candidates: a generated llama cpu deployment, mutated in a copy.

Manifest mutations edit the JSON; kernel mutations copy the kernels module with one function
changed into a new module file (new sha256) and point only the affected ops at it, so every
other op keeps its implementation and the diff stays local."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def variant(base: Path, out: Path, edit: Callable[[dict], None] | None = None,
            patch: tuple[list[tuple[str, str]], list[str]] | None = None, module: str = "planted",
            of: str = "kernels") -> Path:
    """Copy the deployment folder `base` (holding manifest.json) to `out` and mutate it.

    patch = ([(old, new), ...] text replacements of the module named `of`, [ops to point at it])."""
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(base, out)
    m = json.loads((out / "manifest.json").read_text())
    if patch is not None:
        reps, ops = patch
        src = (out / m["modules"][of]["source"]).read_text()
        for old, new in reps:
            assert src.count(old) >= 1, f"planted patch does not apply: {old!r}"
            src = src.replace(old, new)
        dst = out / "kernels" / f"{module}.py"
        dst.write_text(src)
        m["modules"][module] = {"source": f"kernels/{module}.py", "sha256": _sha(dst)}
        for op in ops:
            for launch in m["ops"][op]["impl"]["launches"]:
                launch["module"] = module
    if edit is not None:
        edit(m)
    (out / "manifest.json").write_text(json.dumps(m, indent=1))
    return out


def _calls(m: dict, program: str):
    return m["programs"][program]["calls"]


def _stepping(m: dict) -> list[str]:
    """The programs that step a batch (prefill, decode and, where there is one, the verify
    program of speculative rounds): a change meant for every step changes them all."""
    return [name for name, p in m["programs"].items() if p.get("batch")]


def _bufs(call: dict) -> list:
    return [a.get("buf") for a in call["args"]]


# ---- bugs that must FAIL ------------------------------------------------------------------


def rope_theta(base: Path, out: Path) -> Path:
    def edit(m):
        arg = _calls(m, "rope_init")[0]["args"][1]
        arg["value"] = arg["value"] / 10
    return variant(base, out, edit)


def residual_dropped(base: Path, out: Path, layer: int = 1) -> Path:
    """The attention residual of one layer: add_rms_norm(x, attn_out, ln2) -> rms_norm(attn_out, ln2)."""
    def edit(m):
        for prog in _stepping(m):
            for c in _calls(m, prog):
                if c["op"] == "add_rms_norm" and _bufs(c)[2] == f"ln2.{layer}":
                    c["op"] = "rms_norm"
                    c["args"] = c["args"][1:]
    return variant(base, out, edit)


def kv_off_by_one(base: Path, out: Path) -> Path:
    return variant(base, out, patch=([("off = p % page_tokens", "off = (p + 1) % page_tokens"),
                                      ("off = pos % page_tokens", "off = (pos + 1) % page_tokens")],
                                     ["kv_append", "kv_append_decode"]))


def gqa_mapping(base: Path, out: Path) -> Path:
    """Query head h reads kv head h % kv_heads instead of h // (heads / kv_heads)."""
    return variant(base, out, patch=([
        ("qg = q[r].reshape(kv_heads, heads // kv_heads, head_dim)",
         "qg = q[r].reshape(heads // kv_heads, kv_heads, head_dim).transpose(1, 0, 2)"),
        ("out[r] = np.matmul(s, v[:, :n]).reshape(heads * head_dim)",
         "out[r] = np.matmul(s, v[:, :n]).transpose(1, 0, 2).reshape(heads * head_dim)")],
        ["attention", "attention_decode"]))


def lm_head_prenorm(base: Path, out: Path) -> Path:
    """The LM head reads the residual stream x, not the final norm's output h."""
    def edit(m):
        last = [c for c in _calls(m, "prefill") if c["op"] == "gather_last"][-1]
        head = [c for c in _calls(m, "decode") if "d_logits" in _bufs(c)][0]
        for c in (last, head):
            c["args"][0]["buf"] = c["args"][0]["buf"][:-1] + "x"
    return variant(base, out, edit)


# ---- changes that must PASS ---------------------------------------------------------------


BF16_PARAMS = ("x", "y", "res", "qkv", "o", "gate_up", "h")  # the activations the cpu kernels take
BF16_MODULE = """

# ---- bf16 storage (tests/judge/planted.py): f32 arithmetic on widened copies, stored in bf16
import ml_dtypes as _ml

_BF16 = np.dtype(_ml.bfloat16)


def _pages(kv, layers, kv_heads, page_tokens, head_dim):
    return kv.view(_BF16).reshape(-1, layers, 2, kv_heads, page_tokens, head_dim)


def _in_f32(fn):
    def run(*args):
        wide = [a.astype(np.float32) if isinstance(a, np.ndarray) and a.dtype == _BF16 else a for a in args]
        fn(*wide)
        for a, w in zip(args, wide):
            if w is not a:
                a[...] = w
    return run


for _name in ("embed", "rms_norm", "add_rms_norm", "linear", "rope", "kv_append", "kv_append_decode",
              "attention", "attention_decode", "silu_mul", "gather_last"):
    globals()[_name] = _in_f32(globals()[_name])
"""


def bf16(base: Path, out: Path) -> Path:
    """The cpu deployment with bf16 activations and a bf16 KV cache (its kernels compute in f32
    on widened copies and store bf16, like a GPU port): a faithful port of the f32 reference in
    another precision, so it must PASS. Logits stay f32, through a linear_logits op."""
    def edit(m):
        for n, b in m["buffers"].items():
            if b["kind"] == "workspace" and b["dtype"] == "f32":
                b["dtype"] = "bf16"
        m["states"]["kv"]["bytes_per_token"]["mul"][-1] = 2
        for op in m["ops"].values():
            op["params"] = [p.replace("buffer<f32>", "buffer<bf16>") if p.split(":")[0] in BF16_PARAMS else p
                            for p in op["params"]]
        m["ops"]["linear_logits"] = {"params": ["x: in buffer<bf16>", "w: in buffer<f32>", "y: out buffer<f32>"],
                                     "impl": {"launches": [{"module": "kernels", "entry": "linear"}]}}
        for prog in _stepping(m):
            for c in _calls(m, prog):
                if any(str(x).endswith("_logits") for x in _bufs(c)) and c["op"] == "linear":
                    c["op"] = "linear_logits"
    v = variant(base, out, edit)
    m = json.loads((v / "manifest.json").read_text())
    mod = v / m["modules"]["kernels"]["source"]
    src = mod.read_text().replace("kv = pages[phys[:npg], layer]  #", "kv = pages[phys[:npg], layer].astype(np.float32)  #")
    mod.write_text(src + BF16_MODULE)
    m["modules"]["kernels"]["sha256"] = _sha(mod)
    (v / "manifest.json").write_text(json.dumps(m, indent=1))
    return v



def embed_swapped(base: Path, out: Path) -> Path:
    """An equivalent embedding kernel (fancy indexing instead of np.take): bit-identical."""
    return variant(base, out, patch=([("    np.take(table, ids, axis=0, out=x)", "    x[:] = table[ids]")], ["embed"]))


def reduction_reordered(base: Path, out: Path) -> Path:
    """Every linear sums its fp32 reduction in two halves: different bits, same numbers."""
    return variant(base, out, patch=([("            np.matmul(panel, x[r], out=out[r])",
                                       "            k = x.shape[1] // 2\n"
                                       "            np.matmul(panel[:, :k], x[r, :k], out=out[r])\n"
                                       "            out[r] += panel[:, k:] @ x[r, k:]")], ["linear"]))


def batched_linear(base: Path, out: Path) -> Path:
    """Every linear one gemm over the step's rows (kern's cpu kernels before batch invariance):
    the same numbers within the floor, but a row's bits change with the rows beside it."""
    return variant(base, out, patch=([("    n, k = w.shape\n    step = max(1, PANEL_BYTES // (4 * k))\n"
                                       "    for lo in range(0, n, step):\n"
                                       "        panel, out = w[lo:lo + step], y[:, lo:lo + step]\n"
                                       "        for r in range(x.shape[0]):\n"
                                       "            np.matmul(panel, x[r], out=out[r])",
                                       "    np.matmul(x, w.T, out=y)")], ["linear"]))


def split_norm(base: Path, out: Path, layer: int = 1) -> Path:
    """The reference side of "a fused norm+residual replacing two calls": one layer's
    add_rms_norm split into add (a new op in a new module) and rms_norm."""
    def edit(m):
        m["ops"]["add"] = {"params": ["res: inout buffer<f32>", "x: in buffer<f32>"],
                           "impl": {"launches": [{"module": "split", "entry": "add"}]}}
        for prog in _stepping(m):
            calls = _calls(m, prog)
            for i, c in enumerate(calls):
                if c["op"] == "add_rms_norm" and _bufs(c)[2] == f"ln2.{layer}":
                    res, x, w, y, eps = c["args"]
                    calls[i:i + 1] = [{"op": "add", "args": [res, x]}, {"op": "rms_norm", "args": [res, w, y, eps]}]
                    break
    v = variant(base, out, edit)
    mod = v / "kernels" / "split.py"
    mod.write_text("def add(res, x):\n    res += x\n")
    m = json.loads((v / "manifest.json").read_text())
    m["modules"]["split"] = {"source": "kernels/split.py", "sha256": _sha(mod)}
    (v / "manifest.json").write_text(json.dumps(m, indent=1))
    return v


FAILS = {"rope_theta": rope_theta, "residual_dropped": residual_dropped, "kv_off_by_one": kv_off_by_one,
         "gqa_mapping": gqa_mapping, "lm_head_prenorm": lm_head_prenorm}


# ---- the same bugs planted in the sm_90a manifest (manifest edits only: its kernels are cubins)


def _prefill_calls(m: dict, op: str) -> list[dict]:
    return [c for c in _calls(m, "prefill") if c["op"] == op]


def _param_index(m: dict, op: str, name: str) -> int:
    """Where op's parameter `name` sits in a call's arguments."""
    return [p.split(":")[0] for p in m["ops"][op]["params"]].index(name)


def cuda_rope_theta(base: Path, out: Path) -> Path:
    """The rope table built with theta / 10 (the largest float argument of rope_table)."""
    def edit(m):
        args = _calls(m, "rope_init")[0]["args"]
        theta = max((a for a in args if isinstance(a.get("value"), float)), key=lambda a: a["value"])
        theta["value"] /= 10
    return variant(base, out, edit)


def cuda_residual_dropped(base: Path, out: Path, layer: int = 1) -> Path:
    """Prefill's attention residual of one layer: the o projection's gemm_residual adds into
    a scratch buffer (act, which the gate/up projection overwrites next) instead of x."""
    def edit(m):
        for c in _prefill_calls(m, "gemm_residual"):
            if _bufs(c)[1] == f"o_w.{layer}":
                c["args"][2] = {"buf": "p_act"}
    return variant(base, out, edit)


def cuda_kv_off_by_one(base: Path, out: Path) -> Path:
    """Prefill's KV append (in the qkv projection's epilogue) strides the page table one page
    too wide (pages_per_seq + 1): the k and v of sequence s land s pages on, where attention
    does not look. (Positions cannot be shifted by one in a manifest: views are 16-byte aligned.)"""
    def edit(m):
        for c in _prefill_calls(m, "norm_gemm_rope_append"):
            i = _param_index(m, c["op"], "pages_per_seq")
            c["args"][i] = {"value": {"add": [c["args"][i]["value"], 1]}}
    return variant(base, out, edit)


def cuda_gqa_mapping(base: Path, out: Path) -> Path:
    """Prefill attention told there is one kv head: every query head reads kv head 0."""
    def edit(m):
        for c in _prefill_calls(m, "attention_rows"):
            c["args"][12] = {"value": 1}  # n_kv_heads
    return variant(base, out, edit)


def cuda_lm_head_prenorm(base: Path, out: Path) -> Path:
    """The LM head on the residual stream x without the final norm: prefill's and decode's
    normed LM heads (norm_gemm_logits, norm_gemv_logits) become plain projections of x."""
    from kern_models.llama.kernels.cuda import table

    def edit(m):
        for prog, normed, plain in (("prefill", "norm_gemm_logits", "gemm_logits"),
                                    ("decode", "norm_gemv_logits", "gemv_logits")):
            for c in _calls(m, prog):
                if c["op"] == normed:  # (x, norm, W, y, [rms_prep's scratch,] rows, N, K, eps)
                    x, _norm, w, y, *_, rows, n, k, _eps = c["args"]
                    c["op"], c["args"] = plain, [x, w, y, rows, n, k]
            m["ops"][plain] = table.ops()[plain]
        for normed in ("norm_gemm_logits", "norm_gemv_logits"):
            if not any(c["op"] == normed for p in m["programs"].values() for c in p["calls"]):
                del m["ops"][normed]
    return variant(base, out, edit)


CUDA_FAILS = {"rope_theta": cuda_rope_theta, "residual_dropped": cuda_residual_dropped,
              "kv_off_by_one": cuda_kv_off_by_one, "gqa_mapping": cuda_gqa_mapping,
              "lm_head_prenorm": cuda_lm_head_prenorm}
