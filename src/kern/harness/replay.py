"""Replay spans from the reference's own inputs, on either side, and run a side free.

A replay restores what the span reads (A's buffers, A's state pages), poisons what only this
side writes, runs this side's calls of the span, then compares on A's write set and counts
the bytes this side changed outside it. Replaying A's own spans gives the noise floor."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from . import compare
from .compare import Err
from .diff import Diff
from .engine_io import EngineIO, poison
from .record import Recording, StepOut, outputs, stepper_for
from .workload import Workload, feed


@dataclass
class SpanRun:
    span: int
    step: int
    errs: dict[str, Err]  # buffer or "state:<name>" -> error on A's write set
    outside: int  # bytes written outside A's write set
    absent: list[str] = field(default_factory=list)  # compared names this side lacks


def replay(io: EngineIO, side: str, diff: Diff, rec: Recording) -> tuple[list[SpanRun], float]:
    t0 = time.perf_counter()
    readers = {s: t.reader() for s, t in rec.tapes.items()}
    out: list[SpanRun] = []
    bufs, states = io.e.m.buffers, io.e.states
    for r in rec.records:
        span = diff.spans[r.span]
        program = span.program
        lo, hi = span.a if side == "a" else span.b
        launches = io.launches(program, lo, hi)
        env = io.e.env(program, r.vars)
        before = {b: io.write(b, x) for b, x in r.pre.items() if b in bufs}
        for b in io.written(launches, env):
            if b not in before:
                before[b] = io.write(b, poison(io.dtype(b), io.extent(b, env, launches)))
        for s, v in r.state_pre.items():
            if s in states:
                io.write_state(s, readers[s].at(v))
        io.run_calls(program, lo, hi, env)
        run = SpanRun(r.span, r.step, {}, 0)
        for b, a_post in r.post.items():
            if b not in bufs:
                run.absent.append(b)
                continue
            run.errs[b] = compare.region(a_post, io.read(b, a_post.size), r.masks[b])
        for b in io.written(launches, env):
            x = before[b]
            run.outside += compare.outside(x, io.read(b, x.size), r.masks.get(b, []))
        for s, v in r.state_post.items():
            if s not in states:
                run.absent.append(f"state {s}")
                continue
            a_post = readers[s].at(v)
            run.errs[f"state:{s}"] = compare.state_bytes(a_post, io.read_state(s, a_post.size))
        out.append(run)
    return out, time.perf_counter() - t0


def free_run(io: EngineIO, wl: Workload) -> tuple[list[StepOut], float]:
    """The whole workload through this side's own programs, from its state at load."""
    t0 = time.perf_counter()
    widths = io.table_widths()
    out = []
    for step in wl.steps:
        st = stepper_for(io, step)
        vars, ins = feed(step, st, wl.seqs, widths)
        env = io.e.run(st.program, vars, ins)
        io.e.device.synchronize()
        out.append(StepOut(st.program, *outputs(io, st, env)))
    return out, time.perf_counter() - t0
