"""The Qwen3-MoE manifest for cuda sm_90a: the llama family's cuda manifest of the dense shape
(kern_models.llama.manifests.cuda: attention, norms, rope, embeddings, LM head, sampling,
graphs), each sparse layer's MLP made a MoE block of the kernels of kernels/cuda/table.py.

Narrow decode (the graph-captured `decode` program, up to 32 rows) reads only the chosen
experts' weights: the post-attention norm, the router's logits (the dense gemv), route, then
moe_gemv_gate_up (a block a chosen expert: its [gate; up] rows read once for every row that
chose it, SwiGLU) and
moe_gemv_down_residual (the chosen experts' down rows, each row's choices weighted and summed
in choice order, added into the residual stream). Wide decode and prefill group the (row,
choice) pairs by expert: the router's logits (a cuBLASLt GEMM), route, moe_sort (a stable
counting sort into tiles of one expert), the grouped GEMMs of gate/up + SwiGLU and of down,
and moe_combine (weighted, in choice order) into the MLP's output, where the dense chain's
residual add picks it up."""

from __future__ import annotations

from kern_models.common.errors import ConfigError
from kern_models.llama.kernels.cuda import table as dense_table
from kern_models.llama.manifests import cuda as dense
from kern_models.llama.manifests.common import b, v

from ..config import MoeShape
from ..kernels.cuda import table
from .common import make_sparse

BF = "bf16"


def check_shape(s: MoeShape) -> None:
    """What the MoE kernels support, every problem at once (the dense ones: llama's manifests.cuda)."""
    problems = []
    if s.experts > table.MAX_EXPERTS:
        problems.append(f"num_experts {s.experts}: the router kernels take at most {table.MAX_EXPERTS}")
    problems += expert_problems(s.hidden, s.moe_inter, s.top_k)
    if problems:
        raise ConfigError("cannot build the sm_90a MoE manifest: " + "; ".join(problems))


def expert_problems(hidden: int, moe_inter: int, top_k: int) -> list[str]:
    """What the expert kernels need of a shape (any family's that runs them)."""
    problems = []
    if top_k > table.MAX_TOP_K:
        problems.append(f"num_experts_per_tok {top_k}: the expert kernels take at most {table.MAX_TOP_K}")
    bk = table.TILES["MOE_BK"]
    for name, n in (("hidden_size", hidden), ("moe_intermediate_size", moe_inter)):
        if n % bk:
            problems.append(f"{name} {n}: the grouped GEMMs need a multiple of {bk}")
    return problems


def build(s: MoeShape, model: str, *, invariant: bool = True, **limits) -> dict:
    check_shape(s)
    m = dense.build(s.dense, model, invariant=False, **limits)  # its programs are cuBLASLt's (make_sparse)
    m["ops"].update(table.ops())
    m["ops"].update({k: op for k, op in dense_table.ops().items() if k in ("rms_norm", "gemv_logits", "gemm_logits")})
    bm = table.TILES["MOE_BM"]

    def ws(name: str, shape: list, dtype: str = BF) -> dict:
        m["buffers"].setdefault(name, {"kind": "workspace", "dtype": dtype, "shape": shape})
        return b(name)

    def block(prog: str, l: int, first: dict, last: dict) -> list[dict]:
        a = first["args"]
        p = a[0]["buf"].split("_", 1)[0] + "_"
        batch = m["programs"][prog]["batch"]
        rows = batch["rows"] if isinstance(batch["rows"], str) else batch["groups"]  # the var counting rows
        router, ids, w = ws(p + "router", [rows, "experts"], "f32"), ws(p + "topk_ids", [rows, "top_k"], "i32"), \
            ws(p + "topk_w", [rows, "top_k"], "f32")
        gate_up, down = b(f"experts_gate_up.{l}"), b(f"experts_down.{l}")
        route = {"op": "moe_route", "args": [router, ids, w, v(rows), v("experts"), v("top_k"), v(int(s.norm_topk))]}
        act = ws(p + "moe_act", [rows, "top_k", "moe_inter"])
        if first["op"] == "norm_gemv_swiglu":  # narrow decode: x, ln2 -> act; then down adds into x
            x, ln2, eps = a[0], a[1], a[-1]
            h = ws(p + "h", [rows, "hidden"])
            return [
                {"op": "rms_norm", "args": [x, ln2, h, v(rows), v("hidden"), eps]},
                {"op": "gemv_logits", "args": [h, b(f"router_w.{l}"), router, v(rows), v("experts"), v("hidden")]},
                route,
                {"op": "moe_gemv_gate_up", "args": [h, ids, gate_up, act, v(rows), v("top_k"), v("moe_inter"),
                                                    v("hidden"), v(0), v("local_experts")]},
                {"op": "moe_gemv_down_residual", "args": [act, ids, w, down, last["args"][2], v(rows), v("top_k"),
                                                          v("hidden"), v("moe_inter")]},
            ]
        h, out = a[0], last["args"][2]  # gemm(h, gate_up_w) .. gemm(act, down_w, mlp_out)
        pairs = {"mul": [rows, "top_k"]}
        tiles = {"add": [{"ceil_div": [pairs, bm]}, "experts"]}
        sorted_, pos = ws(p + "moe_sorted", [pairs], "i32"), ws(p + "moe_pos", [pairs], "i32")
        tile_buf = ws(p + "moe_tiles", [{"add": [1, {"mul": [3, tiles]}]}], "i32")
        y = ws(p + "moe_y", [pairs, "hidden"], "f32")
        return [
            {"op": "gemm_logits", "args": [h, b(f"router_w.{l}"), router, v(rows), v("experts"), v("hidden")]},
            route,
            {"op": "moe_sort", "args": [ids, sorted_, pos, tile_buf, v(pairs), v("experts")]},
            {"op": "moe_group_gate_up", "args": [h, sorted_, tile_buf, gate_up, act, v("top_k"), v("moe_inter"),
                                                 v("hidden"), v(0), v("local_experts"), v(tiles)]},
            {"op": "moe_group_down", "args": [act, tile_buf, down, y, v("hidden"), v("moe_inter"), v(0),
                                              v("local_experts"), v(tiles)]},
            {"op": "moe_combine", "args": [y, pos, w, out, v(rows), v("top_k"), v("hidden")]},
        ]

    m["modules"][table.MODULE] = {"source": f"kernels/{table.MODULE}.cubin", "sha256": ""}
    return make_sparse(m, s, BF, block)
