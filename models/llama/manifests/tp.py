"""Tensor-parallel llama manifests: one manifest a rank, made from the single-device one.

Megatron's split: the projections that fan out (fused qkv, fused gate/up) are sharded by rows
(rank r keeps its heads and its slice of the intermediate width), the ones that fan in (o,
down) by columns, so each rank's attention and MLP run on its own heads and slice and only the
fan-in projections' outputs are summed across ranks: two all-reduces a layer. The KV state
holds the rank's own kv heads. Norms and the embedding are whole on every rank, and every rank
ends with the same logits and tokens (the next token feeds back on each rank's own device;
nothing but the all-reduces and the logits' all-gather crosses between GPUs).

The transform is data: constants (heads, kv_heads, inter become a rank's), bind segments with
row / column ranges, and each fan-in projection followed by an all-reduce call. The all-reduce
a call gets is chosen by its largest message (its var maxima) and the ranks: up to
PEER_MAX_BYTES (2 MiB), or at any size over more than NCCL_MAX_RANKS (2) ranks, the
peer-memory kernel after the projection (kernels/cuda/allreduce.cu: one barrier; on cuda decode
the projection pushes its part into every rank's buffer and the all-reduce sums them locally,
elsewhere the all-reduce reads every rank's part over NVLink), past it NCCL (the runtime's
extern call). The cpu target always uses the peer kernel
(cpu/collectives.py): the cpu device runs ranks as threads of one process, and the kernel's
barrier and peer reads are the GPU kernel's, in numpy.

The LM head is split by vocabulary when the vocabulary divides (_shard_head): each rank
computes its slice of the logits, and an all-gather behind the same barrier puts every slice
in place on every rank before sampling, so every rank still samples the same token."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

from kern_models.common.cubins import sha256_of

from ..config import ConfigError, Shape
from ..kernels.cuda import CUBINS

PEER_MAX_BYTES = 2 << 20
# NCCL takes the large messages only where its sum is one addition an element: over 2 ranks
# each element is round(a + b) = round(b + a), the same bits whatever algorithm, protocol or
# chunking NCCL picks for a message's size. Over more ranks its ring or tree adds the parts in
# an order that depends on the element's chunk and on the message size (and rounds to bf16
# between hops), so a token's bytes would depend on how many rows shared its prefill step: there
# the peer kernel takes every size, summing in rank order (docs/tensor-parallel.md, determinism).
NCCL_MAX_RANKS = 2
AR_BLOCKS_CUDA = 16  # blocks of the peer kernel: each owns a barrier slot (flags, epoch) and a stripe
AR_THREADS = 512
TP_GROUP = "tp"

# the checkpoint tensors a rank keeps a slice of: (axis, which part of the fused buffer's rows)
_ROWS = {"self_attn.q_proj.weight": "q", "self_attn.k_proj.weight": "kv", "self_attn.v_proj.weight": "kv",
         "mlp.gate_proj.weight": "inter", "mlp.up_proj.weight": "inter"}
_COLS = {"self_attn.o_proj.weight": "q", "mlp.down_proj.weight": "inter"}
_FAN_IN = ("o_w.", "down_w.")
HEAD = "lm_head"


def check(s: Shape, ranks: int) -> None:
    """Every reason this shape cannot split over `ranks`, as one ConfigError."""
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise ConfigError(f"tp {ranks!r}: must be a whole number >= 1")
    problems = [f"{name} {n} does not split over {ranks} ranks" for name, n in
                (("num_attention_heads", s.heads), ("num_key_value_heads", s.kv_heads),
                 ("intermediate_size", s.inter)) if n % ranks]
    if problems:
        raise ConfigError(f"tp {ranks}: " + "; ".join(problems))


def shard(m: dict, s: Shape, ranks: int, rank: int, pdl: bool = True) -> dict:
    """Rank `rank`'s manifest of a `ranks`-way split of `m` (a manifest of manifests/cpu.py or
    manifests/cuda.py for shape `s`; not changed). pdl (cuda): decode's fan-in projections and
    peer all-reduces take programmatic dependent launch, as the rest of the decode chain: the
    projection streams its weights while attention finishes, the next one while the all-reduce
    waits on the other ranks (allreduce.cu). Decode's fan-in projections on cuda store their
    parts into every rank's buffer (gemv_push) and the all-reduce sums them from local memory
    (all_reduce_add_local)."""
    check(s, ranks)
    m = copy.deepcopy(m)
    per = {"q": s.heads // ranks * s.head_dim, "kv": s.kv_heads // ranks * s.head_dim, "inter": s.inter // ranks}
    m["constants"].update(heads=s.heads // ranks, kv_heads=s.kv_heads // ranks, inter=s.inter // ranks)
    for b in m["buffers"].values():
        for seg in b.get("bind") or []:
            suffix = seg["tensor"].split(".", 3)[-1]
            if suffix in _ROWS:
                n = per[_ROWS[suffix]]
                seg["rows"] = [rank * n, (rank + 1) * n]
            elif suffix in _COLS:
                n = per[_COLS[suffix]]
                seg["cols"] = [rank * n, (rank + 1) * n]
    cuda = m["target"]["device"] == "cuda"
    if cuda and per["inter"] % 8:
        raise ConfigError(f"tp {ranks}: intermediate_size {s.inter} over {ranks} ranks is {per['inter']}, "
                          "the gemv kernels need a multiple of 8")
    blocks = AR_BLOCKS_CUDA if cuda else 1
    m["constants"].update(ranks=ranks, ar_blocks=blocks)
    m["buffers"].update({
        "ar_flags": {"kind": "carry", "dtype": "u32", "shape": ["ar_blocks", "ranks"]},
        "ar_flag_peers": {"kind": "peer", "dtype": "u64", "shape": ["ranks"], "of": "ar_flags"},
        "ar_epoch": {"kind": "carry", "dtype": "u32", "shape": ["ar_blocks"]},
    })
    ops = m["ops"]
    head = _shard_head(m, ranks, rank)
    for name, prog in m["programs"].items():
        if prog.get("once"):
            continue
        rows = _rows_var(prog)
        rows_max = m["vars"][rows]["max"]
        calls, k = [], 0
        for call in prog["calls"]:
            if head and any(a.get("buf") == HEAD for a in call["args"]):
                calls += _gathered(m, ops, name, call, cuda, ranks, rank, pdl)
                continue
            w = _fan_in_weight(call)
            if w is None:
                calls.append(call)
                continue
            calls += _all_reduced(m, ops, name, call, rows, rows_max, k, cuda, ranks, rank, pdl)
            k += 1
        prog["calls"] = calls
    used = {c["op"] for prog in m["programs"].values() for c in prog["calls"]}
    m["ops"] = {name: op for name, op in ops.items() if name in used}
    m["topology"] = {"ranks": ranks, "rank": rank, "groups": {TP_GROUP: [list(range(ranks))]}}
    return m


def _shard_head(m: dict, ranks: int, rank: int) -> bool:
    """The LM head split by vocabulary rows, rank r keeping rows [r V/N, (r+1) V/N), when the
    vocabulary divides: the head is the largest single weight a step reads (1 GB of Llama-3.1-8B's
    8 a rank), and its logits cross to the other ranks once a step (_gathered)."""
    vocab = m["constants"]["vocab"]
    if vocab % ranks:
        return False
    part = vocab // ranks
    m["constants"]["vocab_shard"] = part
    buf = m["buffers"][HEAD]
    buf["shape"] = ["vocab_shard", *buf["shape"][1:]]
    for seg in buf["bind"]:
        seg["rows"] = [rank * part, (rank + 1) * part]
    return True


def _gathered(m: dict, ops: dict, prog: str, call: dict, cuda: bool, ranks: int, rank: int, pdl: bool) -> list[dict]:
    """An LM head call on the rank's vocabulary slice, into an exported part buffer, then the
    all-gather that puts every rank's slice of the logits in place on every rank: the sampling
    after it sees the whole vocabulary, as unsplit. The part is written again only a step later,
    after every rank has passed that step's all-reduces (so every rank has finished reading it)."""
    a = call["args"]
    w = next(i for i, x in enumerate(a) if x.get("buf") == HEAD)
    y = a[w + 1]
    rows = m["buffers"][y["buf"]]["shape"][0]
    part = exported(m, f"lg_part.{prog}", [rows, "vocab_shard"], "f32")
    head = {**call, "args": [*a[:w + 1], {"buf": part},
                             *({"value": "vocab_shard"} if x.get("value") == "vocab" else x for x in a[w + 2:])]}
    if cuda:
        ops.setdefault("all_gather", _op("allreduce", "all_gather_f32", "y: out buffer<f32>", "ar_blocks", AR_THREADS,
                                         pdl, tail=("rows: i32", "width: i32")))
    else:
        ops.setdefault("all_gather", _op("collectives", "all_gather", "y: out buffer<f32>", 1, 1,
                                         tail=("rows: i32", "width: i32")))
    barrier = [{"buf": part + "_peers"}, {"buf": "ar_flag_peers"}, {"buf": "ar_flags"}, {"buf": "ar_epoch"}]
    return [head, {"op": "all_gather", "args": [*barrier, y, {"value": rank}, {"value": ranks}, {"value": rows},
                                                {"value": "vocab_shard"}]}]


def _rows_var(prog: dict) -> str:
    """The var counting a program's rows: its batch's rows (prefill) or groups (decode)."""
    b = prog["batch"]
    return b["rows"] if isinstance(b["rows"], str) else b["groups"]


def _fan_in_weight(call: dict) -> str | None:
    for a in call["args"]:
        if isinstance(a.get("buf"), str) and a["buf"].startswith(_FAN_IN):
            return a["buf"]
    return None


def _all_reduced(m: dict, ops: dict, prog: str, call: dict, rows: str, rows_max: int, k: int, cuda: bool,
                 ranks: int, rank: int, pdl: bool) -> list[dict]:
    """A fan-in projection followed by the all-reduce that sums its output over the ranks.

    Peer path: the projection writes its part into half k % 2 of the program's exported part
    buffer, and the all-reduce sums every rank's part into the original output (cpu `linear`,
    cuda prefill `gemm`) or adds the sum into the residual (cuda decode `gemv_residual`). Two
    halves, used in turn, let one barrier an all-reduce suffice: a rank writes a half again only
    after every rank has passed the next all-reduce's barrier, so every rank has finished
    reading it. Pushed (cuda decode): the projection stores its part into slot `rank` of
    every rank's buffer and the all-reduce sums the slots from local memory (_pushed). NCCL path
    (cuda, large messages): the projection as it was, then an in-place all-reduce of its output."""
    op = call["op"]
    a = call["args"]
    n = {"mul": [rows, "hidden"]}
    if cuda and op in PUSHED:  # the residual adds (every fan-in of the invariant build): pushed at any size
        return _pushed(m, ops, prog, call, rows, k, ranks, rank, pdl)
    part_dtype = "f32" if not cuda else "bf16"
    if cuda and ranks <= NCCL_MAX_RANKS and rows_max * m["constants"]["hidden"] * 2 > PEER_MAX_BYTES:
        ops.setdefault("all_reduce_nccl", nccl_all_reduce_op())
        return [call, {"op": "all_reduce_nccl", "args": [a[2], {"value": n}]}]
    part = exported(m, f"ar_part.{prog}", [2, rows, "hidden"], part_dtype)
    offset = {"mul": [k % 2, rows, "hidden"]} if k % 2 else 0
    view = {"buf": part, "offset": offset, "shape": [rows, "hidden"]} if k % 2 else \
        {"buf": part, "shape": [rows, "hidden"]}
    barrier = [{"buf": part + "_peers"}, {"buf": "ar_flag_peers"}, {"buf": "ar_flags"}, {"buf": "ar_epoch"}]
    scalars = [{"value": rank}, {"value": ranks}, {"value": offset}, {"value": n}]
    if not cuda:
        ops.setdefault("all_reduce", _op("collectives", "all_reduce_sum", "y: out buffer<f32>", 1, 1))
        return [{**call, "args": [a[0], a[1], view]},
                {"op": "all_reduce", "args": [*barrier, a[2], *scalars]}]
    ops.setdefault("all_reduce", peer_all_reduce_op())
    return [{**call, "args": [a[0], a[1], view, *a[3:]]},
            {"op": "all_reduce", "args": [*barrier, a[2], *scalars]}]


# A fan-in projection that adds into the residual (res += x W^T), and its pushing twin in
# allreduce.cu: the same projection (the same kernel template, grid, block and shared memory),
# its f32 part stored into slot `rank` of every rank's part buffer instead. The gemv is decode's;
# the gemm ones the invariant build's prefill and wide decode (the split one with its partials
# and counters), so every program of that build keeps a row's part in the gemv's order.
PUSHED = {"gemv_residual": "gemv_push", "gemm_residual": "gemm_push", "gemm_residual_split": "gemm_push_split"}


def _push_op(spec: dict, entry: str, pdl: bool) -> dict:
    """The pushing twin's op of a residual projection's op `spec` (one launch): x and W as they
    were (tensor maps where the spec reads them in tiles), the rank's part out to `recv` and
    every rank's through `parts`, the split's scratch kept."""
    (launch,) = spec["impl"]["launches"]
    scratch = [p for p in spec["params"] if p.startswith(("part:", "sem:"))]
    la = {**{k: v for k, v in launch.items() if k not in ("writes", "pdl")}, "module": "allreduce", "entry": entry,
          "writes": ["recv", *(["part"] if scratch else [])], **({"pdl": True} if pdl and "pdl" in launch else {})}
    return {"params": ["x: in buffer<bf16>", "W: in buffer<bf16>", "recv: out buffer<f32>", "parts: in buffer<u64>",
                       *scratch, "rank: i32", "ranks: i32", "offset: i32", "rows: i32", "N: i32", "K: i32"],
            "impl": {"launches": [la]}}


def _pushed(m: dict, ops: dict, prog: str, call: dict, rows: str, k: int, ranks: int, rank: int,
            pdl: bool) -> list[dict]:
    """A residual projection (x, W, res[, part, sem], dims) of the unsplit chain as its pushing
    twin (PUSHED: the rank's part into slot `rank` of half k % 2 of every rank's part buffer
    [2, ranks, rows, hidden]) and all_reduce_add_local (the barrier, then the slots summed in
    rank order from local memory into res)."""
    x, w, res, *rest = call["args"]
    scratch, dims = rest[:len(rest) - 3], rest[len(rest) - 3:]
    push = PUSHED[call["op"]]
    part = exported(m, f"ar_push.{prog}", [2, "ranks", rows, "hidden"], "f32")
    ops.setdefault(push, _push_op(ops[call["op"]], push, pdl))
    ops.setdefault("all_reduce_add_local", add_local_op(pdl))
    offset = {"mul": [k % 2, "ranks", rows, "hidden"]} if k % 2 else 0
    scalars = [{"value": rank}, {"value": ranks}, {"value": offset}]
    return [{"op": push, "args": [x, w, {"buf": part}, {"buf": part + "_peers"}, *scratch, *scalars, *dims]},
            {"op": "all_reduce_add_local", "args": [{"buf": part}, {"buf": "ar_flag_peers"}, {"buf": "ar_flags"},
                                                    {"buf": "ar_epoch"}, res, *scalars,
                                                    {"value": {"mul": [rows, "hidden"]}}]}]


def add_local_op(pdl: bool) -> dict:
    """all_reduce_add_local: the barrier, then every rank's pushed slot (of `recv`, filled by a
    pushing kernel: gemv_push here, another family's expert projections) summed in rank order from
    local memory into res."""
    return {"params": ["recv: in buffer<f32>", "flag_peers: in buffer<u64>", "flags: inout buffer<u32>",
                       "epoch: inout buffer<u32>", "res: inout buffer<bf16>", "rank: i32", "ranks: i32",
                       "offset: i32", "n: i32"],
            "impl": {"launches": [{"module": "allreduce", "entry": "all_reduce_add_local", "grid": ["ar_blocks"],
                                   "block": [AR_THREADS], **({"pdl": True} if pdl else {})}]}}


def exported(m: dict, name: str, shape: list, dtype: str) -> str:
    """A workspace the other ranks reach, and its peer table (every rank's address of it)."""
    m["buffers"][name] = {"kind": "workspace", "dtype": dtype, "shape": shape}
    m["buffers"][name + "_peers"] = {"kind": "peer", "dtype": "u64", "shape": ["ranks"], "of": name}
    return name


def peer_all_reduce_op() -> dict:
    """all_reduce (cuda): the barrier, then every rank's bf16 part read over NVLink and summed in
    rank order into y."""
    return _op("allreduce", "all_reduce_bf16", "y: out buffer<bf16>", "ar_blocks", AR_THREADS)


def nccl_all_reduce_op() -> dict:
    """all_reduce_nccl: NCCL's in-place sum of x over the ranks (the runtime's extern call)."""
    return {"params": ["x: inout buffer<bf16>", "n: i32"],
            "impl": {"launches": [{"entry": "extern:nccl_all_reduce_sum_bf16"}]}}


def _op(module: str, entry: str, out: str, grid, block, pdl: bool = False,
        tail: tuple[str, ...] = ("offset: i32", "n: i32")) -> dict:
    launch = {"module": module, "entry": entry, "grid": [grid], "block": [block], **({"pdl": True} if pdl else {})}
    return {"params": ["parts: in buffer<u64>", "flag_peers: in buffer<u64>", "flags: inout buffer<u32>",
                       "epoch: inout buffer<u32>", out, "rank: i32", "ranks: i32", *tail],
            "impl": {"launches": [launch]}}


# ---- the modules a split adds --------------------------------------------------------------

CPU_MODULE = Path(__file__).resolve().parents[1] / "kernels" / "cpu" / "collectives.py"


def add_module(m: dict, kernels: Path) -> None:
    """The collectives module of a split manifest, copied (cpu) or provided (cuda) into kernels/."""
    if m["target"]["device"] == "cpu":
        shutil.copyfile(CPU_MODULE, kernels / "collectives.py")
        m["modules"]["collectives"] = {"source": "kernels/collectives.py", "sha256": sha256_of(kernels / "collectives.py")}
    elif any(la.get("module") == "allreduce" for op in m["ops"].values() for la in op["impl"]["launches"]):
        (digest,) = CUBINS.provide(kernels, ["allreduce.cubin"]).values()
        m["modules"]["allreduce"] = {"source": "kernels/allreduce.cubin", "sha256": digest}
