"""The Qwen3-MoE manifest for cuda sm_90a: the llama family's cuda manifest of the dense shape
(kern_models.llama.manifests.cuda: attention, norms, rope, embeddings, LM head, sampling,
graphs), each sparse layer's MLP made a MoE block of the kernels of kernels/cuda/table.py.

The default build is batch-invariant (docs/determinism.md): the dense programs are llama's
invariant ones and every program's MoE block computes a row as the others do (moe_wg.cu): the
post-attention rms_norm into h, the router's logits, moe_route (ties to the lower expert, the
row alone decides), the experts' outputs by pair in the gemv's k order, and moe_combine_residual
(each row's choices weighted in choice order, added into the residual stream x). Narrow decode
(the graph-captured `decode` program, up to 32 rows) reads only the chosen experts' weights:
gemv_logits, moe_gather_gate_up and moe_gather_down (a block a chosen expert, its rows read once
for every row that chose it, on mma.sync). Wide decode and prefill group the (row, choice) pairs
by expert: moe_router_gemm, moe_sort (a stable counting sort into tiles of one expert), then
moe_wg_gate_up and moe_wg_down (wgmma over the tiles, their rows gathered on the fly).

batch_invariant=False (--no-batch-invariance): the dense chain's wide decode and prefill through
cuBLASLt, their MoE block the router as a cuBLASLt GEMM and moe.cu's wmma tiles
(moe_group_gate_up, moe_group_down, moe_combine into the MLP's output, where the dense chain's
residual add picks it up); narrow decode is the default build's."""

from __future__ import annotations

from kern_models.common.errors import ConfigError
from kern_models.llama.kernels.cuda import table as dense_table
from kern_models.llama.manifests import cuda as dense
from kern_models.common.manifest_parts import buffer_arg, value_arg

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


def build(s: MoeShape, model: str, *, batch_invariant: bool = True, **limits) -> dict:
    """batch_invariant (the default): the llama family's batch-invariant programs with the MoE block of
    moe_wg.cu in every one (a row's bits its own: docs/determinism.md); False: the faster build,
    the dense chain's prefill and wide decode through cuBLASLt, its MoE block moe.cu's wmma tiles."""
    check_shape(s)
    m = dense.build(s.dense, model, batch_invariant=batch_invariant, **limits)
    m["ops"].update(table.ops())
    m["ops"].update({k: op for k, op in dense_table.ops().items() if k in ("rms_norm", "gemv_logits", "gemm_logits")})
    bm = table.TILES["MOE_BM"]

    def ws(name: str, shape: list, dtype: str = BF) -> dict:
        m["buffers"].setdefault(name, {"kind": "workspace", "dtype": dtype, "shape": shape})
        return buffer_arg(name)

    def block(prog: str, l: int, first: dict, last: dict) -> list[dict]:
        a = first["args"]
        p = a[0]["buf"].split("_", 1)[0] + "_"
        batch = m["programs"][prog]["batch"]
        rows = batch["rows"] if isinstance(batch["rows"], str) else batch["groups"]  # the var counting rows
        router, ids, w = ws(p + "router", [rows, "experts"], "f32"), ws(p + "topk_ids", [rows, "top_k"], "i32"), \
            ws(p + "topk_w", [rows, "top_k"], "f32")
        gate_up, down, router_w = buffer_arg(f"experts_gate_up.{l}"), buffer_arg(f"experts_down.{l}"), buffer_arg(f"router_w.{l}")
        route = {"op": "moe_route", "args": [router, ids, w, value_arg(rows), value_arg("experts"), value_arg("top_k"), value_arg(int(s.norm_topk))]}
        pairs = {"mul": [rows, "top_k"]}
        held = [value_arg(0), value_arg("local_experts")]  # first, count: every expert on one device (ep.py sets a rank's)
        tiles = {"add": [{"ceil_div": [pairs, bm]}, "experts"]}
        sort = lambda: [{"op": "moe_sort", "args": [ids, ws(p + "moe_sorted", [pairs], "i32"),
                                                    ws(p + "moe_pos", [pairs], "i32"), tile_buf(), value_arg(pairs),
                                                    value_arg("experts")]}]
        tile_buf = lambda: ws(p + "moe_tiles", [{"add": [1, {"mul": [3, tiles]}]}], "i32")
        if first["op"] in ("norm_gemv_swiglu", "norm_gemm_swiglu", "norm_gemm_swiglu_split"):
            # x, ln2 -> the experts' outputs by pair (f32) -> weighted into x, in every program the
            # same arithmetic a row: the narrow decode's gathers on mma.sync, the wide decode's and
            # prefill's tiles on wgmma, in one k order (moe_wg.cu)
            x, ln2, eps = a[0], a[1], a[-1]
            h, y = ws(p + "h", [rows, "hidden"]), ws(p + "moe_y", [pairs, "hidden"], "f32")
            act = ws(p + "moe_act", [pairs, "moe_inter"])
            calls = [{"op": "rms_norm", "args": [x, ln2, h, value_arg(rows), value_arg("hidden"), eps]}]
            sorted_ = buffer_arg(p + "moe_sorted")
            # the router: narrow decode's gemv, the wide decode's on 8 blocks (a partial each, in
            # the wide projections' scratch and counters), prefill's many rows unsplit; then every
            # program's experts as moe_sort's tiles on the persistent wgmma blocks, which read
            # only the chosen experts' rows at any batch (at one row: 8 tiles beside 12 / 16
            # column tiles, 96 / 128 blocks streaming, where the gather gemvs' short blocks ran)
            # (the wide decode is known by its program, not by its dense MLP's op: that one splits
            # only below the llama manifest's SPLIT_BELOW_TILES, the router's one tile always)
            wide = prog == "decode_wide" and first["op"] != "norm_gemv_swiglu"
            if first["op"] == "norm_gemv_swiglu":
                router_calls = {"op": "gemv_logits", "args": [h, router_w, router, value_arg(rows), value_arg("experts"),
                                                              value_arg("hidden")]}
            elif wide and p + "gpart" in m["buffers"]:
                router_calls = {"op": "moe_router_gemm_split", "args": [h, router_w, router, buffer_arg(p + "gpart"),
                                                                         buffer_arg(p + "gsem"), value_arg(rows), value_arg("experts"),
                                                                         value_arg("hidden")]}
            else:
                router_calls = {"op": "moe_router_gemm", "args": [h, router_w, router, value_arg(rows), value_arg("experts"),
                                                                  value_arg("hidden")]}
            # the decode programs route and sort in one launch (moe_route_sort: the same ids,
            # weights and tiles as moe_route then moe_sort), within its bounds; prefill's many
            # rows keep a block a row for the router
            fused = ((wide or first["op"] == "norm_gemv_swiglu") and s.experts <= table.FUSED_EXPERTS
                     and m["vars"][rows]["max"] * s.top_k <= table.FUSED_PAIRS)
            routing = [{"op": "moe_route_sort", "args": [router, ids, w, ws(p + "moe_sorted", [pairs], "i32"),
                                                         ws(p + "moe_pos", [pairs], "i32"), tile_buf(), value_arg(rows),
                                                         value_arg("experts"), value_arg("top_k"),
                                                         value_arg(int(s.norm_topk))]}] if fused else [route, *sort()]
            calls += [router_calls,
                      *routing,
                      {"op": "moe_wg_gate_up", "args": [h, sorted_, tile_buf(), gate_up, act, value_arg("top_k"),
                                                        value_arg("moe_inter"), value_arg("hidden"), *held, value_arg(tiles)]},
                      {"op": "moe_wg_down", "args": [act, sorted_, tile_buf(), down, y, value_arg("hidden"),
                                                     value_arg("moe_inter"), *held, value_arg(tiles)]}]
            return calls + [{"op": "moe_combine_residual", "args": [y, ids, w, x, value_arg(rows), value_arg("top_k"), value_arg("hidden"),
                                                                    *held]}]
        # the faster build's wide decode and prefill: gemm(h, gate_up_w) .. gemm(act, down_w, mlp_out)
        h, out = a[0], last["args"][2]
        act = ws(p + "moe_act", [pairs, "moe_inter"])
        y = ws(p + "moe_y", [pairs, "hidden"], "f32")
        sorted_, pos = buffer_arg(p + "moe_sorted"), buffer_arg(p + "moe_pos")
        return [
            {"op": "gemm_logits", "args": [h, router_w, router, value_arg(rows), value_arg("experts"), value_arg("hidden")]},
            route, *sort(),
            {"op": "moe_group_gate_up", "args": [h, sorted_, tile_buf(), gate_up, act, value_arg("top_k"), value_arg("moe_inter"),
                                                 value_arg("hidden"), *held, value_arg(tiles)]},
            {"op": "moe_group_down", "args": [act, tile_buf(), down, y, value_arg("hidden"), value_arg("moe_inter"), *held,
                                              value_arg(tiles)]},
            {"op": "moe_combine", "args": [y, pos, w, out, value_arg(rows), value_arg("top_k"), value_arg("hidden")]},
        ]

    used = {ln["module"] for op in m["ops"].values() for ln in op["impl"]["launches"] if "module" in ln}
    for module in sorted(used - set(m["modules"])):  # the MoE's, and the dense ones its block adds (norm)
        m["modules"][module] = {"source": f"kernels/{module}.cubin", "sha256": ""}
    return make_sparse(m, s, BF, block)
