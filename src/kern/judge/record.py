"""Record the reference: run the workload through A with every program cut at its spans; at
each span keep what it reads (buffers, and state pages as tape versions) and what it writes
(A's write set: values and the element intervals its launches declare). The unchanged calls
between spans run as they are. The end-to-end outputs of every step are kept too."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

from ..drive.engine_io import EngineIO
from ..drive.script import ScriptStep, Script, feed
from .diff import Diff, Span
from .tape import Tape


@dataclass
class SpanRecord:
    span: int  # index into diff.spans
    step: int  # workload step, -1 for a once program
    vars: dict[str, int]
    pre: dict[str, np.ndarray]  # buffer -> flat prefix before the span
    post: dict[str, np.ndarray]  # A's compared writes -> flat prefix after the span
    masks: dict[str, list[tuple[int, int]]]  # every buffer A writes -> its written intervals
    state_pre: dict[str, int]  # state -> tape version
    state_post: dict[str, int]


@dataclass
class StepOut:
    program: str
    tokens: np.ndarray | None
    logits: np.ndarray | None


@dataclass
class Recording:
    records: list[SpanRecord] = field(default_factory=list)
    tapes: dict[str, Tape] = field(default_factory=dict)
    outputs: list[StepOut] = field(default_factory=list)
    programs_run: set[str] = field(default_factory=set)
    seconds: float = 0.0

    @property
    def stored_bytes(self) -> int:
        arrays = {id(x): x for r in self.records for x in (*r.pre.values(), *r.post.values())}
        return sum(t.stored for t in self.tapes.values()) + sum(x.nbytes for x in arrays.values())


def outputs(io: EngineIO, st, env) -> tuple[np.ndarray | None, np.ndarray | None]:
    tok = io.e.read(st.outputs["tokens"], env).copy() if "tokens" in st.outputs else None
    log = io.e.read(st.outputs["logits"], env).copy() if "logits" in st.outputs else None
    return tok, log


def stepper_for(io: EngineIO, step: ScriptStep):
    if step.round:
        return io.e.protocol.verify
    return io.e.protocol.for_rows(len(step.chunks), None if step.ragged else 1)


class Live:
    """A recording arriving from a Recorder's sink in another process (forked.py), read once in
    order: its tapes grow as the records that name their versions arrive."""

    def __init__(self, messages: Iterable[tuple]):
        self.tapes: dict[str, Tape] = {}
        self._messages = messages

    @property
    def records(self) -> Iterator[SpanRecord]:
        for msg in self._messages:
            if msg[0] == "tape":
                self.tapes[msg[1]] = Tape(msg[2])
            elif msg[0] == "delta":
                self.tapes[msg[1]].add(msg[2], msg[3])
            elif msg[0] == "record":
                yield msg[1]


class Recorder:
    def __init__(self, io: EngineIO, diff: Diff, wl: Script, carried: frozenset[str] = frozenset(),
                 sink: Callable[[tuple], None] | None = None):
        self.io, self.diff, self.wl, self.carried = io, diff, wl, carried
        self.sink = sink or (lambda msg: None)
        self.rec = Recording()
        self.dirty: dict[str, bool] = {}  # states written since their last snapshot
        # buffers as last kept, while nothing writes them: a span's inputs are often the last
        # span's outputs (or a table written once), kept once
        self.kept: dict[str, np.ndarray] = {}
        self.by_program: dict[str, list[int]] = {}
        for i, s in enumerate(diff.spans):
            if not s.missing:
                self.by_program.setdefault(s.program, []).append(i)
        for i in self.by_program.values():
            i.sort(key=lambda k: diff.spans[k].a)

    def _snap(self, state: str) -> int:
        tape = self.rec.tapes.get(state)
        if tape is None:
            tape = self.rec.tapes[state] = Tape(self.io.state_prefix(state, self.wl.pages_used, len(self.wl.seqs)))
            self.sink(("tape", state, tape.nbytes))
        elif state in self.carried:  # replays carry it from its first version: never read again
            return tape.version
        if self.dirty.get(state, True):
            v = tape.version
            tape.snap(self.io.read_state(state, tape.nbytes))
            self.dirty[state] = False
            if tape.version != v:
                self.sink(("delta", state, *tape.deltas[-1]))
        return tape.version

    def _run(self, program: str, lo: int, hi: int, env) -> list:
        ls = self.io.run_calls(program, lo, hi, env)
        for s in self.io.states_written(ls):
            self.dirty[s] = True
        for b in self.io.written(ls, env):
            self.kept.pop(b, None)
        return ls

    def _read(self, buf: str, n: int) -> np.ndarray:
        x = self.kept.get(buf)
        if x is None or x.size != n:
            x = self.kept[buf] = self.io.read(buf, n)
        return x

    def _program(self, program: str, step: int, vars: dict[str, int], env) -> None:
        io, at = self.io, 0
        for k in self.by_program.get(program, []):
            span: Span = self.diff.spans[k]
            lo, hi = span.a
            self._run(program, at, lo, env)
            launches = io.launches(program, lo, hi)
            # the span's reads A has (a buffer only B has is one of B's own inputs: the replay
            # feeds it from B's own stepper)
            bufs = io.e.m.buffers
            pre = {b: self._read(b, io.extent(b, env, launches)) for b in span.inputs if b in bufs}
            st_pre = {s: self._snap(s) for s in span.states}
            self._run(program, lo, hi, env)
            masks = io.written(launches, env)
            post = {b: self._read(b, io.extent(b, env, launches)) for b in span.sa.live_writes}
            st_post = {s: self._snap(s) for s in span.states}
            self.rec.records.append(SpanRecord(k, step, dict(vars), pre, post, masks, st_pre, st_post))
            self.sink(("record", self.rec.records[-1]))
            at = hi
        self._run(program, at, len(io.e.m.programs[program].calls), env)
        self.rec.programs_run.add(program)

    def run(self) -> Recording:
        t0 = time.perf_counter()
        io = self.io
        for p in io.e.protocol.once:  # ran at load; run again, cut at its spans, if it has any
            if p in self.by_program:
                self._program(p, -1, {}, io.e.env(p, {}))
            self.rec.programs_run.add(p)
        widths = io.table_widths()
        for i, step in enumerate(self.wl.steps):
            st = stepper_for(io, step)
            vars, ins = feed(step, st, self.wl.seqs, widths)
            env = io.e.env(st.program, vars)
            for buf, host in ins.items():
                io.e.write_input(st.program, buf, host, env)
                self.kept.pop(buf, None)
            self._program(st.program, i, vars, env)
            self.rec.outputs.append(StepOut(st.program, *outputs(io, st, env)))
        self.rec.seconds = time.perf_counter() - t0
        return self.rec


def record(io: EngineIO, diff: Diff, wl: Script, carried: frozenset[str] = frozenset(),
           sink: Callable[[tuple], None] | None = None) -> Recording:
    """carried: states the replays carry (precision.py), kept at their first version only.
    sink: told each new tape, tape delta and span record as it is made (a Live elsewhere)."""
    return Recorder(io, diff, wl, carried, sink).run()
