"""Dataflow of a program's calls (pure): what each call reads and writes, what is live at each
cut, how many times each buffer and state has been written before it; and the boundaries two
programs share inside a span, where a span whose two sides fuse their calls differently can be
cut into smaller spans that replay on their own.

A buffer is *live* at a cut when some later call reads it before a call rewrites it whole (an
`out` view of the whole buffer). A buffer's *version* at a cut is how many calls wrote it
before the cut. Two cuts, i in A's span and j in B's, are a shared boundary when everything B
reads after j holds in A at i what it holds in B at j: every buffer live in B at j is A's too,
written as many times since the span began on both sides (the k-th residual add of a layer is
the k-th on either side, whatever calls made it), and every state the span writes has been
written as many times on both sides. B's own inputs and carries are exempt (OWN). What B computed inside the span and reads after j is then compared there, and
B's next span starts from A's values of it. No names of models or buffers: only the counts."""

from __future__ import annotations

from dataclasses import dataclass

from ..manifest.schema import BufArg, StateArg
from ..manifest.verify import Verified


# Buffers of these kinds that only B declares are B's own: inputs are fed from the same workload
# on either side, a carry is memory B keeps for itself between its calls (a grid's semaphores).
OWN = ("input", "carry")


@dataclass(frozen=True, slots=True)
class Access:
    reads: frozenset[str]  # non-weight buffers and states read (in, inout)
    writes: frozenset[str]  # buffers and states written (out, inout)
    kills: frozenset[str]  # buffers written whole and not read by the call: dead before it


class Flow:
    """One program of one manifest: per call its accesses; per cut (0..n) what is live after it
    and how often each name was written before it."""

    def __init__(self, v: Verified, program: str):
        m = v.manifest
        self.buffers, self.states = m.buffers, m.states
        self.calls: list[Access] = []
        for c in m.programs[program].calls:
            reads, writes, whole = set(), set(), set()
            for p, a in zip(v.params[c.op], c.args):
                if isinstance(a, BufArg):
                    if p.direction in ("in", "inout") and m.buffers[a.buf].kind != "weight":
                        reads.add(a.buf)
                    if p.writes:
                        writes.add(a.buf)
                        if p.direction == "out" and a.offset is None and a.shape is None:
                            whole.add(a.buf)
                elif isinstance(a, StateArg):
                    if p.direction in ("in", "inout"):
                        reads.add(a.state)
                    if p.writes:
                        writes.add(a.state)
            self.calls.append(Access(frozenset(reads), frozenset(writes), frozenset(whole - reads)))
        n = len(self.calls)
        self.live: list[frozenset[str]] = [frozenset()] * (n + 1)
        live: set[str] = set()
        for k in range(n - 1, -1, -1):
            live = (live - self.calls[k].kills) | self.calls[k].reads
            self.live[k] = frozenset(live)
        self.version: list[dict[str, int]] = [{}]
        for acc in self.calls:
            seen = dict(self.version[-1])
            for name in acc.writes:
                seen[name] = seen.get(name, 0) + 1
            self.version.append(seen)

    def written(self, name: str, lo: int, hi: int) -> int:
        """Calls in [lo, hi) that write `name`."""
        return self.version[hi].get(name, 0) - self.version[lo].get(name, 0)

    def io(self, lo: int, hi: int) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], tuple[str, ...],
                                            tuple[str, ...]]:
        """Calls [lo, hi): the buffers they read before writing them whole (what a replay
        restores), every buffer they write, the written ones live after hi or not workspace
        (what a replay compares), the states read and the states written."""
        reads: dict[str, None] = {}
        writes: dict[str, None] = {}
        sr: dict[str, None] = {}
        sw: dict[str, None] = {}
        dead: set[str] = set()
        for acc in self.calls[lo:hi]:
            for name in sorted(acc.reads):
                if name in self.states:
                    sr[name] = None
                elif name not in dead:
                    reads[name] = None
            for name in sorted(acc.writes):
                (sw if name in self.states else writes)[name] = None
            dead |= acc.kills
        live = tuple(b for b in writes if self.buffers[b].kind != "workspace" or b in self.live[hi])
        return tuple(reads), tuple(writes), live, tuple(sr), tuple(sw)


def _shared(fa: Flow, fb: Flow, a: tuple[int, int], b: tuple[int, int], i: int, j: int,
            states: set[str]) -> tuple[str, ...] | None:
    """The buffers B computed in its span and reads after j, if (i, j) is a shared boundary."""
    for s in states:
        if fa.written(s, a[0], i) != fb.written(s, b[0], j):
            return None
    made = []
    for name in sorted(fb.live[j]):
        if name in fb.states:
            continue
        if name not in fa.buffers:
            if fb.buffers[name].kind in OWN:
                continue
            return None
        k = fb.written(name, b[0], j)
        if fa.written(name, a[0], i) != k:
            return None
        if k:
            made.append(name)
    return tuple(made) or None


def shared_cuts(fa: Flow, fb: Flow, a: tuple[int, int], b: tuple[int, int]) -> list[tuple[int, int, tuple[str, ...]]]:
    """The shared boundaries strictly inside the span A[a) ~ B[b), in order: (i, j, the buffers
    compared there). Each B cut takes the first A cut past the last boundary that matches it."""
    states = {n for f, (lo, hi) in ((fa, a), (fb, b)) for acc in f.calls[lo:hi] for n in acc.writes
              if n in f.states}
    out: list[tuple[int, int, tuple[str, ...]]] = []
    start = a[0] + 1
    for j in range(b[0] + 1, b[1]):
        for i in range(start, a[1]):
            made = _shared(fa, fb, a, b, i, j, states)
            if made is not None:
                out.append((i, j, made))
                start = i + 1
                break
    return out
