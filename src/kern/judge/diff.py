"""Diff two verified manifests call by call: align each program's call lists, and turn what
changed into spans A[lo:hi) ~ B[lo:hi), each with the buffers it reads from outside and writes.

Pure: no device, no files. Two calls match when their op's implementation is the same (params
and launches, each module named by its sha256) and their arguments are the same (buffer and
state declarations included): a call of an op whose implementation changed never matches.
Inside a changed run, calls of the same op over the same buffers are paired into one-call
spans, so a kernel swapped in every layer gives one span per layer, not one per program."""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..manifest.schema import BufArg, Call, StateArg
from ..manifest.verify import Verified
from .boundaries import OWN, Flow, shared_cuts


@dataclass(frozen=True, slots=True)
class Side:
    """What one side of a span does: its calls' ops, what they read and write."""

    ops: tuple[str, ...]
    reads: tuple[str, ...]  # non-weight buffers read before the side writes them whole: restored from A
    writes: tuple[str, ...]  # buffers written through out/inout params
    live_writes: tuple[str, ...]  # writes read after the span before rewritten (or not workspace): compared
    states_read: tuple[str, ...]
    states_written: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Span:
    program: str
    a: tuple[int, int]  # call range [lo, hi) in A's program
    b: tuple[int, int]  # call range [lo, hi) in B's program
    sa: Side
    sb: Side
    missing: tuple[str, ...]  # boundary buffers/states absent on one side, e.g. "buffer 'x' (not in B)"

    @property
    def label(self) -> str:
        return f"{self.program} A[{self.a[0]}:{self.a[1]}) ~ B[{self.b[0]}:{self.b[1]})"

    @property
    def ops(self) -> str:
        return f"{'+'.join(self.sa.ops) or '(none)'} -> {'+'.join(self.sb.ops) or '(none)'}"

    @property
    def inputs(self) -> tuple[str, ...]:
        """Buffers a replay restores from A before running either side (reads of both)."""
        return tuple(sorted(set(self.sa.reads) | set(self.sb.reads)))

    @property
    def states(self) -> tuple[str, ...]:
        return tuple(sorted(set(self.sa.states_read + self.sa.states_written + self.sb.states_read
                                + self.sb.states_written)))


@dataclass(frozen=True, slots=True)
class Diff:
    spans: tuple[Span, ...]
    ops_changed: tuple[str, ...]  # same name, different implementation
    ops_added: tuple[str, ...]
    ops_removed: tuple[str, ...]
    calls_added: int  # B calls matched by nothing in A
    calls_removed: int  # A calls matched by nothing in B
    programs_only_a: tuple[str, ...]
    programs_only_b: tuple[str, ...]
    calls_a: int
    calls_b: int

    @property
    def identical(self) -> bool:
        return not (self.spans or self.programs_only_a or self.programs_only_b)

    def summary(self) -> list[str]:
        out = [f"diff: {self.calls_a} calls in A, {self.calls_b} in B; {len(self.spans)} span"
               f"{'' if len(self.spans) == 1 else 's'}; {self.calls_removed} calls removed, "
               f"{self.calls_added} added"]
        if self.ops_changed:
            out.append(f"diff: ops changed: {', '.join(self.ops_changed)}")
        if self.ops_added or self.ops_removed:
            out.append(f"diff: ops added: {', '.join(self.ops_added) or '-'}; removed: "
                       f"{', '.join(self.ops_removed) or '-'}")
        for p in self.programs_only_a:
            out.append(f"diff: program {p!r} only in A")
        for p in self.programs_only_b:
            out.append(f"diff: program {p!r} only in B")
        for s in self.spans:
            line = f"diff: span {s.label}: {s.ops}"
            if s.missing:
                line += f"; boundary not on both sides: {', '.join(s.missing)}"
            out.append(line)
        return out


# ---- fingerprints -------------------------------------------------------------------------


def _dump(x) -> str:
    return json.dumps(x, sort_keys=True, separators=(",", ":"))


def _op_print(v: Verified, name: str) -> str:
    op = v.manifest.ops[name].model_dump(mode="json")
    for l in op["impl"]["launches"]:
        mod = l.get("module")
        if mod is not None:
            l["module"] = "sha256:" + v.manifest.modules[mod].sha256
    return _dump(op)


def _arg_print(v: Verified, a) -> object:
    m = v.manifest
    if isinstance(a, BufArg):
        return ["buf", a.model_dump(mode="json"), m.buffers[a.buf].model_dump(mode="json")]
    if isinstance(a, StateArg):
        return ["state", a.state, m.states[a.state].model_dump(mode="json")]
    return ["value", a.model_dump(mode="json")]


def strict_keys(v: Verified, program: str) -> list[str]:
    ops: dict[str, str] = {}
    out = []
    for c in v.manifest.programs[program].calls:
        if c.op not in ops:
            ops[c.op] = _op_print(v, c.op)
        out.append(_dump([ops[c.op], [_arg_print(v, a) for a in c.args]]))
    return out


def loose_key(c: Call) -> str:
    """Same op name over the same buffers and states (values and implementation aside)."""
    return _dump([c.op, [a.buf if isinstance(a, BufArg) else a.state for a in c.args
                         if isinstance(a, (BufArg, StateArg))]])


# ---- alignment ----------------------------------------------------------------------------


def lcs(a: list, b: list) -> list[tuple[int, int]]:
    """Index pairs of a longest common subsequence (common prefix and suffix taken first)."""
    n, m = len(a), len(b)
    pre = 0
    while pre < n and pre < m and a[pre] == b[pre]:
        pre += 1
    suf = 0
    while suf < n - pre and suf < m - pre and a[n - 1 - suf] == b[m - 1 - suf]:
        suf += 1
    mid_a, mid_b = a[pre:n - suf], b[pre:m - suf]
    pairs = [(i, i) for i in range(pre)]
    if mid_a and mid_b:
        ra, rb = len(mid_a), len(mid_b)
        t = [[0] * (rb + 1) for _ in range(ra + 1)]
        for i in range(ra - 1, -1, -1):
            row, nxt = t[i], t[i + 1]
            x = mid_a[i]
            for j in range(rb - 1, -1, -1):
                row[j] = nxt[j + 1] + 1 if x == mid_b[j] else max(nxt[j], row[j + 1])
        i = j = 0
        while i < ra and j < rb:
            if mid_a[i] == mid_b[j]:
                pairs.append((pre + i, pre + j))
                i += 1
                j += 1
            elif t[i + 1][j] >= t[i][j + 1]:
                i += 1
            else:
                j += 1
    pairs += [(n - suf + k, m - suf + k) for k in range(suf)]
    return pairs


def _gaps(pairs: list[tuple[int, int]], n: int, m: int) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """The unmatched runs between matched pairs: ((a_lo, a_hi), (b_lo, b_hi)), non-empty."""
    out = []
    pa = pb = 0
    for i, j in [*pairs, (n, m)]:
        if i > pa or j > pb:
            out.append(((pa, i), (pb, j)))
        pa, pb = i + 1, j + 1
    return out


def _ranges(v_a: Verified, v_b: Verified, program: str) -> tuple[list, int, int]:
    ca, cb = v_a.manifest.programs[program].calls, v_b.manifest.programs[program].calls
    ka, kb = strict_keys(v_a, program), strict_keys(v_b, program)
    matched = lcs(ka, kb)
    out = []
    for (alo, ahi), (blo, bhi) in _gaps(matched, len(ca), len(cb)):
        # inside a changed run, pair calls of the same op over the same buffers
        la = [loose_key(c) for c in ca[alo:ahi]]
        lb = [loose_key(c) for c in cb[blo:bhi]]
        inner = lcs(la, lb)
        cuts: list[tuple[tuple[int, int], tuple[int, int]]] = []
        for (glo, ghi), (hlo, hhi) in _gaps(inner, len(la), len(lb)):
            cuts.append(((alo + glo, alo + ghi), (blo + hlo, blo + hhi)))
        cuts += [((alo + i, alo + i + 1), (blo + j, blo + j + 1)) for i, j in inner]
        out += sorted(cuts)
    return out, len(ca) - len(matched), len(cb) - len(matched)


# ---- span I/O -----------------------------------------------------------------------------


def _side(f: Flow, ops: tuple[str, ...], lo: int, hi: int, compare: tuple[str, ...] | None = None) -> Side:
    reads, writes, live, sr, sw = f.io(lo, hi)
    return Side(ops, reads, writes, live if compare is None else compare, sr, sw)


def _missing(v_a: Verified, v_b: Verified, sa: Side, sb: Side) -> tuple[str, ...]:
    """What keeps a span from replaying: a buffer B reads that A cannot hand it (B's own inputs
    aside: each side is fed from the workload), one A's replay compares that B lacks, a state
    one side lacks. A's reads that B lacks, and B's writes that A lacks, are each side's own."""
    ma, mb = v_a.manifest, v_b.manifest
    out = []
    for name in sb.reads:
        if name not in ma.buffers and mb.buffers[name].kind not in OWN:
            out.append(f"buffer {name!r} (not in A)")
    for name in sa.live_writes:
        if name not in mb.buffers:
            out.append(f"buffer {name!r} (not in B)")
    for name in dict.fromkeys(sa.states_read + sa.states_written + sb.states_read + sb.states_written):
        for m, side in ((ma, "A"), (mb, "B")):
            if name not in m.states:
                out.append(f"state {name!r} (not in {side})")
    return tuple(out)


def _spans(v_a: Verified, v_b: Verified, fa: Flow, fb: Flow, program: str, a: tuple[int, int],
           b: tuple[int, int]) -> list[Span]:
    """The span A[a) ~ B[b), cut where both sides share a boundary (boundaries.py): its pieces
    compare, at each inner boundary, what B computed there and reads after it."""
    ca, cb = v_a.manifest.programs[program].calls, v_b.manifest.programs[program].calls
    cuts = shared_cuts(fa, fb, a, b) if a[1] - a[0] > 1 and b[1] - b[0] > 1 else []
    out = []
    for (alo, blo, _), (ahi, bhi, made) in zip([(a[0], b[0], ()), *cuts], [*cuts, (a[1], b[1], None)]):
        if made is not None:  # compared where both sides wrote it in this piece
            made = tuple(n for n in made if fa.written(n, alo, ahi) and fb.written(n, blo, bhi))
        ops_a, ops_b = tuple(c.op for c in ca[alo:ahi]), tuple(c.op for c in cb[blo:bhi])
        sa, sb = _side(fa, ops_a, alo, ahi, made), _side(fb, ops_b, blo, bhi, made)
        out.append(Span(program, (alo, ahi), (blo, bhi), sa, sb, _missing(v_a, v_b, sa, sb)))
    return out


def diff(v_a: Verified, v_b: Verified) -> Diff:
    ma, mb = v_a.manifest, v_b.manifest
    spans: list[Span] = []
    removed = added = 0
    for program in ma.programs:
        if program not in mb.programs:
            continue
        ranges, r, a = _ranges(v_a, v_b, program)
        removed += r
        added += a
        fa, fb = Flow(v_a, program), Flow(v_b, program)
        for ra, rb in ranges:
            spans += _spans(v_a, v_b, fa, fb, program, ra, rb)
    only_a = tuple(p for p in ma.programs if p not in mb.programs)
    only_b = tuple(p for p in mb.programs if p not in ma.programs)
    removed += sum(len(ma.programs[p].calls) for p in only_a)
    added += sum(len(mb.programs[p].calls) for p in only_b)
    changed = tuple(o for o in ma.ops if o in mb.ops and _op_print(v_a, o) != _op_print(v_b, o))
    return Diff(tuple(spans), changed, tuple(o for o in mb.ops if o not in ma.ops),
                tuple(o for o in ma.ops if o not in mb.ops), added, removed, only_a, only_b,
                sum(len(p.calls) for p in ma.programs.values()), sum(len(p.calls) for p in mb.programs.values()))
