"""Whether a side's outputs depend on the batch: each sequence of the workload run again alone
(its own chunks and decode rows, nothing beside them, so a decode step takes the narrowest
program and a prompt chunk a ragged step of one group) and its logits compared byte for byte
with the rows it got inside the workload's batches. kern promises a request's bytes whatever
else shares its steps (docs/determinism.md); a side that breaks that is named."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..drive.engine_io import EngineIO
from ..drive.script import Script, ScriptStep
from .record import StepOut
from .replay import free_run


@dataclass(frozen=True, slots=True)
class Differs:
    seq: int
    step: int  # the workload step of its first row that differs
    rows: int  # of its rows, how many differ
    worst: float  # largest |batched - alone| over its logits


@dataclass(frozen=True, slots=True)
class Invariance:
    workload: str  # "workload" or "wide"
    seqs: int
    rows: int  # rows compared
    differ: tuple[Differs, ...]
    seconds: float

    @property
    def holds(self) -> bool:
        return not self.differ

    def line(self, who: str) -> str:
        if self.holds:
            return (f"batch invariance ({self.workload}): B gives each of its {self.seqs} sequences run alone "
                    f"the bytes it gave them inside the batches ({self.rows} rows)")
        first = self.differ[0]
        return (f"batch invariance ({self.workload}): BROKEN by {who}: {len(self.differ)} of {self.seqs} sequences get other "
                f"logits alone than inside the batches (first sequence {first.seq} at step {first.step}, "
                f"{first.rows} rows, max |diff| {first.worst:.3g}): its outputs depend on the batch")

    def to_json(self) -> dict:
        return {"workload": self.workload, "holds": self.holds, "sequences": self.seqs, "rows": self.rows,
                "differ": [{"seq": d.seq, "step": d.step, "rows": d.rows, "worst": d.worst} for d in self.differ]}


def alone(wl: Script, s: int) -> Script:
    """The workload's steps of sequence s only (its chunks and decode rows, in order)."""
    steps = tuple(ScriptStep(st.ragged, tuple(c for c in st.chunks if c.seq == s), st.round) for st in wl.steps)
    return Script(wl.seed, wl.seqs, tuple(st for st in steps if st.chunks), wl.pages_used, wl.natural)


def _row(o: StepOut, st: ScriptStep, g: int) -> np.ndarray | None:
    """Group g's output of a step: its logits, or its token where the program gives no logits
    (a speculative round's: every row of the group)."""
    out = o.logits if o.logits is not None else o.tokens
    if out is None:
        return None
    if st.round:
        lo = sum(len(c.tokens) for c in st.chunks[:g])
        return out[lo:lo + len(st.chunks[g].tokens)]
    return out[g] if o.logits is not None else out[g:g + 1]


def _rows(out: list[StepOut], wl: Script, s: int) -> list[tuple[int, np.ndarray]]:
    """Sequence s's rows inside the batched run, with their step."""
    rows = [(t, _row(o, st, g)) for t, (o, st) in enumerate(zip(out, wl.steps))
            for g, c in enumerate(st.chunks) if c.seq == s]
    return [(t, r) for t, r in rows if r is not None]


def check(io: EngineIO, wl: Script, batched: list[StepOut], workload: str = "workload") -> Invariance:
    """Each sequence alone on this side, against `batched` (this side's free run of wl). Each
    alone run rewrites only its own sequence's pages and slot, so the runs may follow each other."""
    t0 = time.perf_counter()
    differ, rows = [], 0
    for s in range(len(wl.seqs)):
        inside = _rows(batched, wl, s)
        one = alone(wl, s)
        lone = [r for r in (_row(o, st, 0) for o, st in zip(free_run(io, one)[0], one.steps)) if r is not None]
        rows += len(inside)
        bad = [(t, float(np.max(np.abs(a.astype(np.float64) - b))) if a.shape == b.shape else float("inf"))
               for (t, a), b in zip(inside, lone) if a.tobytes() != b.tobytes()]
        if bad or len(lone) != len(inside):
            differ.append(Differs(s, bad[0][0] if bad else -1, len(bad), max((w for _, w in bad), default=0.0)))
    return Invariance(workload, len(wl.seqs), rows, tuple(differ), time.perf_counter() - t0)
