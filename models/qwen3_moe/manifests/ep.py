"""Expert-parallel Qwen3-MoE manifests: one manifest a rank, made from the single-device one.

The experts of every sparse layer split over the ranks of the `ep` group: rank r holds experts
[r E/N, (r+1) E/N) (its `experts_*` buffers bind only their tensors). Everything else (the
embedding, attention, norms, the router, the LM head) is whole on every rank, so every rank
routes every row the same way and ends with the same logits. Each sparse layer's experts call
is wrapped in two all-to-alls over peer buffers the manifest declares:

  dispatch  row t goes from its home rank (t % N) to each rank that owns one of its experts,
            into that rank's exported `recv` rows (then one barrier);
  experts   each rank runs its own experts on the rows it received (the single device's
            arithmetic: an expert's rows, in row order);
  combine   each rank writes its (row, choice) outputs into every rank's exported `gathered`
            buffer, crosses a barrier, and sums each row's choices with their weights in choice
            order: every rank holds the whole MoE output, bit for bit the single device's.

The barrier and peer writes are the collectives module's (the cpu device runs ranks as threads
of one process, kern.world.ranks, so CI runs this end to end)."""

from __future__ import annotations

import copy

from kern_models.common.errors import ConfigError
from kern_models.llama.manifests import tp as tensor_parallel

from ..config import MoeShape
from ..kernels.cuda import table
from .common import expert_weights

EP_GROUP = "ep"


def check(s: MoeShape, ranks: int) -> None:
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise ConfigError(f"ep {ranks!r}: must be a whole number >= 1")
    if s.experts % ranks:
        raise ConfigError(f"ep {ranks}: num_experts {s.experts} does not split over {ranks} ranks")


def _barrier_op(entry: str, *params: str) -> dict:
    return {"params": ["parts: in buffer<u64>", "flag_peers: in buffer<u64>", "flags: inout buffer<u32>",
                       "epoch: inout buffer<u32>", *params],
            "impl": {"launches": [{"module": "collectives", "entry": entry}]}}


OPS_CPU = {
    "ep_dispatch": _barrier_op("dispatch_rows", "x: in buffer<f32>", "ids: in buffer<i32>",
                               "recv: out buffer<f32>", "rank: i32",
                               "ranks: i32", "per_rank: i32"),
    "ep_combine": _barrier_op("combine_rows", "y: in buffer<f32>", "ids: in buffer<i32>", "weights: in buffer<f32>",
                              "out: out buffer<f32>", "rank: i32", "ranks: i32", "per_rank: i32"),
}


def shard(m: dict, s: MoeShape, ranks: int, rank: int) -> dict:
    """Rank `rank`'s manifest of a `ranks`-way expert split of `m` (a single-device Qwen3-MoE
    manifest of shape `s`; not changed)."""
    check(s, ranks)
    m = copy.deepcopy(m)
    cuda = m["target"]["device"] == "cuda"
    per = s.experts // ranks
    dtype = m["buffers"]["embed"]["dtype"]
    m["constants"].update(local_experts=per, ranks=ranks, ar_blocks=tensor_parallel.AR_BLOCKS_CUDA if cuda else 1)
    for l, sparse in enumerate(s.sparse):
        if sparse:
            m["buffers"].update(expert_weights(s, l, dtype, rank * per, per))
    m["buffers"].update({
        "ar_flags": {"kind": "carry", "dtype": "u32", "shape": ["ar_blocks", "ranks"]},
        "ar_flag_peers": {"kind": "peer", "dtype": "u64", "shape": ["ranks"], "of": "ar_flags"},
        "ar_epoch": {"kind": "carry", "dtype": "u32", "shape": ["ar_blocks"]},
    })
    if cuda:
        _shard_cuda(m, ranks, rank, per)
    else:
        _shard_cpu(m, ranks, rank, per)
    m["ops"] = {n: op for n, op in m["ops"].items() if any(c["op"] == n for p in m["programs"].values()
                                                           for c in p["calls"])}
    m["topology"] = {"ranks": ranks, "rank": rank, "groups": {EP_GROUP: [list(range(ranks))]}}
    return m


def _barrier(part: str) -> list[dict]:
    return [{"buf": part + "_peers"}, {"buf": "ar_flag_peers"}, {"buf": "ar_flags"}, {"buf": "ar_epoch"}]


def _shard_cpu(m: dict, ranks: int, rank: int, per: int) -> None:
    """dispatch, the rank's experts on the rows it received, combine: the two all-to-alls."""
    m["ops"].update(OPS_CPU)
    scalars = [{"value": rank}, {"value": ranks}, {"value": "local_experts"}]
    for prog in m["programs"].values():
        calls = []
        for call in prog["calls"]:
            a = call["args"]
            if call["op"] == "moe_experts":
                x, ids, y = a[0], a[1], a[4]
                p = x["buf"].split("_", 1)[0] + "_"
                rows = m["buffers"][x["buf"]]["shape"][0]
                tensor_parallel.exported(m, p + "recv", [rows, "hidden"], "f32")
                calls.append({"op": "ep_dispatch", "args": [*_barrier(p + "recv"), x, ids, {"buf": p + "recv"},
                                                            *scalars]})
                calls.append({**call, "args": [{"buf": p + "recv"}, ids, a[2], a[3], y,
                                               {"value": rank * per}, {"value": "local_experts"}]})
            elif call["op"] == "moe_combine":
                y, w, out = a
                p = y["buf"].split("_", 1)[0] + "_"
                rows = m["buffers"][y["buf"]]["shape"][0]
                ids = {"buf": p + "topk_ids"}
                tensor_parallel.exported(m, p + "gathered", [rows, "top_k", "hidden"], "f32")
                calls.append({"op": "ep_combine", "args": [*_barrier(p + "gathered"), y, ids, w, out, *scalars]})
            else:
                calls.append(call)
        prog["calls"] = calls


def _shard_cuda(m: dict, ranks: int, rank: int, per: int) -> None:
    """On the GPUs every rank already holds every row (attention is whole on each), so rows need
    no dispatch: each rank runs its experts on the rows routed to them (the MoE kernels' `first`
    and `count`), and the combine is an all-reduce of the ranks' parts over NVLink peer buffers
    (the tensor-parallel collectives: allreduce.cu). The default build's combine pushes its held
    choices' sum (f32) into every rank's buffer (moe_combine_push) and all_reduce_add_local adds
    the ranks' slots into the residual, in every program; the faster build's wide decode and
    prefill combine writes its part and all_reduce_bf16 sums them into the MLP output, NCCL's
    all-reduce where a prefill's message is past the peer kernel's limit. (The ranks' sums in
    rank order are not the one device's sum in choice order: a split's bits are its own.)"""
    ops = m["ops"]
    params = {n: [p.split(":")[0] for p in op["params"]] for n, op in ops.items()}
    ops.update({k: op for k, op in table.ops().items() if k in ("moe_combine_push", "moe_combine_part")})
    first, count = {"value": rank * per}, {"value": "local_experts"}
    hidden = m["constants"]["hidden"]
    for name, prog in m["programs"].items():
        if prog.get("once"):
            continue
        batch = prog["batch"]
        rows = batch["rows"] if isinstance(batch["rows"], str) else batch["groups"]
        rows_max = m["vars"][rows]["max"]
        n = {"mul": [rows, "hidden"]}
        calls, k = [], 0
        for call in prog["calls"]:
            a = list(call["args"])
            if call["op"] == "moe_combine_residual":  # y, ids, w, res, rows, top_k, hidden, first, count
                recv = tensor_parallel.exported(m, f"ep_push.{name}", [2, "ranks", rows, "hidden"], "f32")
                pushed = {"mul": [k % 2, "ranks", rows, "hidden"]} if k % 2 else 0
                at = [{"value": rank}, {"value": ranks}, {"value": pushed}]
                ops.setdefault("all_reduce_add_local", tensor_parallel.add_local_op(False))
                calls += [{"op": "moe_combine_push", "args": [*a[:3], {"buf": recv}, {"buf": recv + "_peers"},
                                                              *a[4:7], first, count, *at]},
                          {"op": "all_reduce_add_local", "args": [{"buf": recv}, *_barrier(recv)[1:], a[3], *at,
                                                                  {"value": n}]}]
                k += 1
                continue
            if "first" in params.get(call["op"], ()):
                a[params[call["op"]].index("first")] = first
                calls.append({**call, "args": a})
                continue
            if call["op"] != "moe_combine":
                calls.append(call)
                continue
            p = a[0]["buf"].split("_", 1)[0] + "_"
            offset = {"mul": [k % 2, rows, "hidden"]} if k % 2 else 0
            scalars = [{"value": rank}, {"value": ranks}, {"value": offset}, {"value": n}]
            y, pos, w, out = a[:4]  # moe_combine (the faster build's): y, pos, w, out, rows, top_k, hidden
            combine = lambda dst: {"op": "moe_combine_part", "args": [y, pos, {"buf": p + "topk_ids"}, w, dst,
                                                                     *a[4:], first, count]}
            if ranks <= tensor_parallel.NCCL_MAX_RANKS and rows_max * hidden * 2 > tensor_parallel.PEER_MAX_BYTES:
                ops.setdefault("all_reduce_nccl", tensor_parallel.nccl_all_reduce_op())
                calls += [combine(out), {"op": "all_reduce_nccl", "args": [out, {"value": n}]}]
            else:
                part = tensor_parallel.exported(m, f"ep_part.{name}", [2, rows, "hidden"], "bf16")
                ops.setdefault("all_reduce", tensor_parallel.peer_all_reduce_op())
                calls += [combine({"buf": part, "offset": offset, "shape": [rows, "hidden"]}),
                          {"op": "all_reduce", "args": [*_barrier(part), out, *scalars]}]
            k += 1
        prog["calls"] = calls


def add_module(m: dict, kernels) -> None:
    """The collectives module (cpu: the peer barrier and the row all-to-alls; cuda: the peer
    all-reduces), as tensor parallel's."""
    tensor_parallel.add_module(m, kernels)
