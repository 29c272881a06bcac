"""Cut a verified manifest into N pipeline stages, balanced by weight bytes or measured times.

Pure: a verified manifest in, stage manifests (JSON-ready dicts) and a plan out. Stages are
aligned across programs by weights: the weights are ordered by first use in the longest
program, a stage owns a contiguous run of them, and in every program a call goes to the stage
of the newest weight used so far. So prefill and decode of one layer land in the same stage,
and so do the state parts their calls touch (each stage keeps every state it touches whole:
what part of a state a call uses is the kernel's business, not the manifest's).

Carried activations: a buffer written before a cut and read after it (before being written
there again) is sent by the stage that wrote it last and received by the stage that reads it.
A received buffer is an `input` of its stage, or a `carry` when the stage also writes it
(inputs are never written by calls). A sent buffer that the stage did not receive is an
`output`. Nothing else changes: every call keeps its op and arguments, so running the stages
in sequence runs exactly the calls of the uncut manifest."""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from ..errors import KernError
from ..manifest.expr import evaluate, names
from ..manifest.schema import DTYPE_BYTES, BufArg, StateArg
from ..manifest.verify import Verified


class CutError(KernError, ValueError):
    """The manifest cannot be cut as asked; one line naming why."""


@dataclass(frozen=True, slots=True)
class Segment:
    """Calls [lo, hi) of `program` in one stage, with the buffers it receives and sends."""

    program: str
    stage: int
    lo: int
    hi: int
    receives: tuple[str, ...]
    sends: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class CutPlan:
    stages: int
    weights: tuple[str, ...]  # every weight in first-use order
    owner: dict[str, int]  # weight -> the stage that owns it
    cost: tuple[float, ...]  # per stage: weight bytes, or the summed times
    segments: tuple[Segment, ...]
    once: dict[int, tuple[str, ...]]  # stage -> the once programs it runs at load

    def of(self, program: str) -> list[Segment]:
        return [s for s in self.segments if s.program == program]


def _access(v: Verified, call) -> tuple[list[str], list[str], list[str]]:
    """(buffers read, buffers written, weights used) by one call."""
    m = v.manifest
    reads, writes, weights = [], [], []
    for p, a in zip(v.params[call.op], call.args):
        if isinstance(a, BufArg):
            if m.buffers[a.buf].kind == "weight":
                weights.append(a.buf)
            elif p.direction != "out":
                reads.append(a.buf)
            if p.writes:
                writes.append(a.buf)
    return reads, writes, weights


def weight_bytes(v: Verified, name: str) -> int:
    env = {**v.constants, **{n: x.max for n, x in v.manifest.vars.items()}}
    b = v.manifest.buffers[name]
    return prod(evaluate(d, env) for d in b.shape) * DTYPE_BYTES[b.dtype]


def _cut_programs(v: Verified) -> list[str]:
    return [n for n, p in v.manifest.programs.items() if not p.once]


def weight_order(v: Verified) -> tuple[str, ...]:
    """Weights by first use in the longest program that is cut; every other program must use
    its weights in the same order, or no cut keeps each stage's weights together."""
    progs = _cut_programs(v)
    longest = max(progs, key=lambda p: len(v.manifest.programs[p].calls))
    order: dict[str, None] = {}
    for p in [longest, *(q for q in progs if q != longest)]:
        seen: list[str] = []
        for c in v.manifest.programs[p].calls:
            for w in _access(v, c)[2]:
                if w not in seen:
                    seen.append(w)
        known = [w for w in seen if w in order]
        if known != sorted(known, key=list(order).index):
            raise CutError(f"programs {longest!r} and {p!r} use their weights in different orders: "
                           "no cut keeps each stage's weights together")
        order.update(dict.fromkeys(seen))
    return tuple(order)


def _weight_costs(v: Verified, order: tuple[str, ...], times: dict[str, list[float]] | None) -> list[float]:
    """The cost of each weight's run of calls: its bytes, or the measured time of the calls
    from its first use to the next weight's (times: program -> time per call)."""
    if times is None:
        return [float(weight_bytes(v, w)) for w in order]
    index = {w: i for i, w in enumerate(order)}
    cost = [0.0] * len(order)
    for p, per_call in times.items():
        calls = v.manifest.programs[p].calls
        if len(per_call) != len(calls):
            raise CutError(f"times for program {p!r} cover {len(per_call)} calls, it has {len(calls)}")
        at = 0
        for c, t in zip(calls, per_call):
            at = max([at, *(index[w] for w in _access(v, c)[2])])
            cost[at] += t
    return cost


def _balance(cost: list[float], n: int) -> list[int]:
    """n - 1 cut indices (stage k starts at weight cuts[k - 1]) whose prefix sums lie closest
    to k / n of the total, each stage keeping at least one weight."""
    total = sum(cost)
    prefix = [0.0]
    for c in cost:
        prefix.append(prefix[-1] + c)
    cuts: list[int] = []
    for k in range(1, n):
        lo = (cuts[-1] if cuts else 0) + 1
        hi = len(cost) - (n - k)
        best = min(range(lo, hi + 1), key=lambda j: (abs(prefix[j] - total * k / n), j))
        cuts.append(best)
    return cuts


def plan(v: Verified, stages: int, times: dict[str, list[float]] | None = None) -> CutPlan:
    """Where each program is cut. `times`: program -> measured time of each of its calls."""
    m = v.manifest
    if stages < 1:
        raise CutError(f"--stages must be at least 1, got {stages}")
    odd = [n for n, b in m.buffers.items() if b.kind in ("peer", "pointers")]
    if odd or m.topology.ranks > 1:
        raise CutError("kern cut takes a single-rank manifest without peer or pointers buffers "
                       f"({', '.join(odd) or f'{m.topology.ranks} ranks'})")
    order = weight_order(v)
    if len(order) < stages:
        raise CutError(f"{stages} stages need at least {stages} weights to own; the manifest binds {len(order)}")
    if times is not None:
        unknown = sorted(set(times) - set(_cut_programs(v)))
        if unknown:
            raise CutError(f"times name program {unknown[0]!r}, which the manifest does not step")
    cost = _weight_costs(v, order, times)
    cuts = _balance(cost, stages)
    bounds = [0, *cuts, len(order)]
    owner = {w: k for k in range(stages) for w in order[bounds[k]:bounds[k + 1]]}
    index = {w: i for i, w in enumerate(order)}
    segments: list[Segment] = []
    for p in _cut_programs(v):
        calls = m.programs[p].calls
        stage_of, at = [], -1
        for c in calls:
            at = max([at, *(index[w] for w in _access(v, c)[2])])
            stage_of.append(0 if at < 0 else owner[order[at]])
        segments += _segments(v, p, stage_of, stages)
    once = _once_programs(v, segments, stages)
    per = [sum(cost[bounds[k]:bounds[k + 1]]) for k in range(stages)]
    return CutPlan(stages, order, owner, tuple(per), tuple(segments), once)


def _segments(v: Verified, program: str, stage_of: list[int], stages: int) -> list[Segment]:
    """Each stage's calls of one program with what crosses its edges (liveness on buffers)."""
    m = v.manifest
    calls = m.programs[program].calls
    acc = [_access(v, c) for c in calls]
    ranges = []
    for k in range(stages):
        idx = [i for i, s in enumerate(stage_of) if s == k]
        ranges.append((idx[0], idx[-1] + 1) if idx else (0, 0))
    carried = {n for n, b in m.buffers.items() if b.kind in ("workspace", "output", "carry")}
    receives: list[list[str]] = [[] for _ in range(stages)]
    sends: list[dict[str, None]] = [{} for _ in range(stages)]
    for k, (lo, hi) in enumerate(ranges):
        written: set[str] = set()
        for i in range(lo, hi):
            reads, writes, _ = acc[i]
            for b in reads:
                if b in carried and b not in written and b not in receives[k]:
                    # read before this stage writes it: the newest earlier stage that wrote it sends it
                    src = [j for j in range(k) if any(b in acc[i2][1] for i2 in range(*ranges[j]))]
                    if not src:
                        if m.buffers[b].kind == "carry":
                            continue  # a carry from another program: checked per stage below
                        raise CutError(f"programs.{program}.calls[{i}] reads {b!r} before any call writes it")
                    receives[k].append(b)
                    sends[src[-1]][b] = None
            written.update(acc[i][1])
    return [Segment(program, k, lo, hi, tuple(receives[k]), tuple(sends[k])) for k, (lo, hi) in enumerate(ranges)]


def _once_programs(v: Verified, segments: list[Segment], stages: int) -> dict[int, tuple[str, ...]]:
    """Each stage runs the once programs that write a carry its calls read; a carry read in a
    stage must be written there (by its own calls or a once program)."""
    m = v.manifest
    once = {n: p for n, p in m.programs.items() if p.once}
    writes_of = {n: {b for c in p.calls for b in _access(v, c)[1]} for n, p in once.items()}
    out: dict[int, tuple[str, ...]] = {}
    for k in range(stages):
        mine = [s for s in segments if s.stage == k]
        reads, writes = set(), set()
        for s in mine:
            for c in m.programs[s.program].calls[s.lo:s.hi]:
                r, w, _ = _access(v, c)
                reads.update(r)
                writes.update(w)
        runs = tuple(n for n, w in writes_of.items() if w & reads)
        have = writes.union(*(writes_of[n] for n in runs))
        for b in sorted(reads):
            if m.buffers[b].kind == "carry" and b not in have and not any(b in s.receives for s in mine):
                raise CutError(f"stage {k} reads carry buffer {b!r}, which another stage writes: cut elsewhere")
        out[k] = runs
    return out


def stage_manifest(v: Verified, p: CutPlan, k: int) -> dict:
    """Stage k as a manifest dict: its calls, the once programs it needs, the buffers, states,
    ops, modules, vars and constants those name, carried buffers re-kinded."""
    m = v.manifest
    doc = m.model_dump(mode="json", exclude_defaults=True)  # what the author wrote, no more
    programs: dict = {}
    for name, prog in doc["programs"].items():
        if name in p.once[k]:
            programs[name] = prog
    received: set[str] = set()
    sent: set[str] = set()
    for s in p.segments:
        if s.stage == k and s.hi > s.lo:
            prog = dict(doc["programs"][s.program])
            prog["calls"] = prog["calls"][s.lo:s.hi]
            programs[s.program] = prog
            received.update(s.receives)
            sent.update(s.sends)
    calls = [c for pr in programs.values() for c in pr["calls"]]
    used_ops = {c["op"] for c in calls}
    used_bufs = {a["buf"] for c in calls for a in c["args"] if "buf" in a}
    used_states = {a["state"] for c in calls for a in c["args"] if "state" in a}
    written = {b for name in programs for s in _calls_of(v, name, p, k) for b in _access(v, s)[1]}
    buffers = {}
    for name, b in doc["buffers"].items():
        if name not in used_bufs:
            continue
        b = dict(b)
        if name in received:  # the role stays with the stage that writes it for the caller
            b["kind"] = "carry" if name in written else "input"
            b.pop("fill", None)
        elif name in sent and b["kind"] == "workspace":
            b["kind"] = "output"
        buffers[name] = b
    for b in buffers.values():
        if b.get("domain", {}).get("index_into"):
            used_states.add(b["domain"]["index_into"])
    ops = {n: o for n, o in doc["ops"].items() if n in used_ops}
    used_mods = {l["module"] for o in ops.values() for l in o["impl"]["launches"] if l.get("module")}
    out = {**doc, "buffers": buffers, "ops": ops, "programs": programs,
           "states": {n: s for n, s in doc["states"].items() if n in used_states},
           "modules": {n: x for n, x in doc["modules"].items() if n in used_mods}}
    return _prune_names(out)


def _calls_of(v: Verified, program: str, p: CutPlan, k: int):
    prog = v.manifest.programs[program]
    if prog.once:
        return prog.calls
    return [c for s in p.of(program) if s.stage == k for c in prog.calls[s.lo:s.hi]]


def _prune_names(doc: dict) -> dict:
    """Drop vars and constants nothing in the stage names (the verifier refuses unused ones)."""
    from ..manifest.schema import Manifest

    m = Manifest.model_validate(doc)
    exprs: list = []
    for _, c in m.calls():
        for a in c.args:
            if isinstance(a, BufArg):
                exprs += [a.offset, *(a.shape or ())]
            elif not isinstance(a, StateArg) and not isinstance(a.value, float):
                exprs.append(a.value)
    for b in m.buffers.values():
        exprs += b.shape
        if b.domain is not None:
            exprs += [*(b.domain.range or ()), b.domain.stride]
    for s in m.states.values():
        exprs += [s.bytes_per_token, s.bytes_per_seq, s.bytes]
    for o in m.ops.values():
        for l in o.impl.launches:
            exprs += [*l.grid, *l.block, l.shared_mem]
            exprs += [a.value for a in l.args or () if not isinstance(a, str) and not isinstance(a.value, float)]
    for pr in m.programs.values():
        if pr.batch is not None:
            exprs += [pr.batch.groups, pr.batch.rows, pr.batch.reach, pr.batch.keys]
    used: set[str] = set()
    todo = [e for e in exprs if e is not None]
    while todo:
        e = todo.pop()
        for n in ({e} if isinstance(e, str) else set() if isinstance(e, int) else names(e)):
            if n not in used:
                used.add(n)
                if n in m.constants:
                    todo.append(m.constants[n])
    doc["vars"] = {n: x for n, x in doc["vars"].items() if n in used}
    doc["constants"] = {n: x for n, x in doc["constants"].items() if n in used}
    return doc


def pipeline_doc(p: CutPlan, source_sha256: str, folders: list[str]) -> dict:
    """pipeline.json: the stages in order and, per program, each stage's calls and carried buffers."""
    progs: dict[str, list] = {}
    for s in p.segments:
        if s.hi > s.lo:
            progs.setdefault(s.program, []).append({"stage": s.stage, "calls": [s.lo, s.hi],
                                                    "receives": list(s.receives), "sends": list(s.sends)})
    return {"kern_pipeline": 1, "source_sha256": source_sha256, "stages": folders,
            "cost": list(p.cost), "programs": progs}
