"""Replay spans from the reference's own inputs, on either side, and run a side free.

A replay restores what the span reads (A's buffers, A's state pages), poisons what only this
side writes, runs this side's calls of the span, then compares on A's write set and counts
the bytes this side changed outside it. Replaying A's own spans gives A's noise; replaying
them in B's precision (precision.py) gives the floor a faithful port stays within."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..drive.engine_io import EngineIO, poison
from ..drive.script import ScriptStep, Script, feed
from . import compare
from .compare import Err
from .diff import Diff
from .precision import Precision, run_rounded
from .record import Live, Recording, StepOut, outputs, stepper_for
from .tape import TapeReader


@dataclass
class SpanRun:
    span: int
    step: int
    errs: dict[str, Err]  # buffer or "state:<name>" -> error on A's write set
    outside: int  # bytes written outside A's write set
    absent: list[str] = field(default_factory=list)  # compared names this side lacks


def replay(io: EngineIO, side: str, diff: Diff, rec: Recording | Live, prec: Precision | None = None,
           rng: np.random.Generator | None = None, start: dict[str, np.ndarray] | None = None,
           wl: Script | None = None) -> tuple[list[SpanRun], float]:
    """Every span record replayed on this side, in order.

    side "a" without rng: A's own noise. side "a" with prec and rng: A in B's precision
    (inputs and every call's writes rounded, precision.py). side "b": B, each step's vars from
    its own stepper for the workload `wl` (B may name and bound them otherwise). prec's carried
    states start from A's first recorded version (side "a") or `start`, B's own bytes at load,
    and are never restored again nor compared."""
    t0 = time.perf_counter()
    readers: dict[str, TapeReader] = {}  # made at first use: a Live recording's tapes arrive with it
    carried = prec.carried if prec is not None else frozenset()
    simulate = side == "a" and prec is not None and rng is not None
    started: set[str] = set()
    have: dict[str, int] = {}  # state -> the tape version this side's bytes are known to equal
    out: list[SpanRun] = []
    bufs, states = io.e.m.buffers, io.e.states
    own: dict[int, dict[str, int]] = {}
    fed: dict[int, dict[str, np.ndarray]] = {}  # B's own inputs a step, for those A does not have
    done: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # buffer -> (A's input as kept, it rounded)
    if side == "b" and wl is not None:
        widths = io.table_widths()
        for i, step in enumerate(wl.steps):
            own[i], fed[i] = feed(step, stepper_for(io, step), wl.seqs, widths)
    for r in rec.records:
        span = diff.spans[r.span]
        program = span.program
        lo, hi = span.a if side == "a" else span.b
        launches = io.launches(program, lo, hi)
        env = io.e.env(program, own.get(r.step, r.vars))
        if simulate:
            pre = {b: _rounded_once(done, b, x, prec, rng) if prec.rounds(b) else x for b, x in r.pre.items()}
        else:
            pre = r.pre
        for b, host in fed.get(r.step, {}).items():
            if b not in pre:
                io.e.write_input(program, b, host, env)
        before = {b: io.write(b, x) for b, x in pre.items() if b in bufs}
        for b in io.written(launches, env):
            if b not in before and not (bufs[b].kind == "carry" and b not in r.masks):  # B's own: kept
                before[b] = io.read(b, io.extent(b, env, launches)).copy()
            elif b not in before:
                before[b] = io.write(b, poison(io.dtype(b), io.extent(b, env, launches)))
        for s, v in r.state_pre.items():
            if s not in states:
                continue
            if s in carried:  # this side's own bytes, written by its earlier replays
                if s not in started:
                    io.write_state(s, _reader(readers, rec, s).at(v) if side == "a" else start[s])
                    started.add(s)
                continue
            if have.get(s) != v:  # restoring a state is a copy of all its used pages: only when it differs
                io.write_state(s, _reader(readers, rec, s).at(v))
                have[s] = v
        if simulate:
            run_rounded(io, prec, program, lo, hi, env, rng)
        else:
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
            if s in carried:
                continue
            if s not in span.sa.states_written and s not in span.sb.states_written and have.get(s) == v:
                continue  # neither side writes it here: its bytes are checked where a span writes it
            a_post = _reader(readers, rec, s).at(v)
            err = run.errs[f"state:{s}"] = compare.state_bytes(a_post, io.read_state(s, a_post.size))
            if err.differ == 0:
                have[s] = v  # this side's bytes are A's version v: the next span starting there needs no restore
            else:
                have.pop(s, None)
        out.append(run)
    return out, time.perf_counter() - t0


def _rounded_once(done: dict[str, tuple[np.ndarray, np.ndarray]], buf: str, x: np.ndarray, prec: Precision,
                  rng: np.random.Generator) -> np.ndarray:
    """A span's input in B's precision, rounded once for every span that reads the same kept
    array (the record keeps a buffer once while nothing writes it: a rope table written at load
    is one array for every layer of every step). A port holds one copy of such a value, so one
    rounding of it, shared, is what it reads; a to-nearest rounding is the same either way."""
    hit = done.get(buf)
    if hit is not None and hit[0] is x:
        return hit[1]
    y = compare.rounded(x, prec.dtypes[buf], rng)
    done[buf] = (x, y)
    return y


def _reader(readers: dict[str, TapeReader], rec: Recording | Live, state: str) -> TapeReader:
    if state not in readers:
        readers[state] = rec.tapes[state].reader()
    return readers[state]


def free_run(io: EngineIO, wl: Script, prec: Precision | None = None,
             rng: np.random.Generator | None = None) -> tuple[list[StepOut], float]:
    """The whole workload through this side's own programs, from its state at load; with prec
    and rng, call by call in B's precision (the end-to-end floor, run on A). A decode step of
    more sequences than this side's decode programs take (the other side's wide decode) runs
    in slices, its rows joined."""
    t0 = time.perf_counter()
    widths = io.table_widths()
    out = []
    for step in wl.steps:
        parts = [_one_step(io, wl, part, widths, prec, rng) for part in _slices(io, step)]
        out.append(parts[0] if len(parts) == 1 else
                   StepOut(parts[0].program, *(None if getattr(parts[0], k) is None else
                                               np.concatenate([getattr(x, k) for x in parts])
                                               for k in ("tokens", "logits"))))
    return out, time.perf_counter() - t0


def _slices(io: EngineIO, step: ScriptStep) -> list[ScriptStep]:
    most = max((s.groups_max for s in io.e.protocol.fixed(1)), default=0) if not step.ragged else 0
    if not most or len(step.chunks) <= most:
        return [step]
    return [ScriptStep(False, step.chunks[i:i + most]) for i in range(0, len(step.chunks), most)]


def _one_step(io: EngineIO, wl: Script, step: ScriptStep, widths: dict[str, int], prec: Precision | None,
              rng: np.random.Generator | None) -> StepOut:
    st = stepper_for(io, step)
    vars, ins = feed(step, st, wl.seqs, widths)
    if prec is not None and rng is not None:
        env = io.e.env(st.program, vars)
        for buf, host in ins.items():
            io.e.write_input(st.program, buf, host, env)
        run_rounded(io, prec, st.program, 0, len(io.e.m.programs[st.program].calls), env, rng)
    else:
        env = io.e.run(st.program, vars, ins)
        io.e.device.synchronize()
    return StepOut(st.program, *outputs(io, st, env))


def floors_where_b_departs(open_a: Callable[[], EngineIO], diff: Diff, rec: Recording, prec: Precision,
                           runs: list[SpanRun], seed: int) -> tuple[list[SpanRun], list[SpanRun], float, float, int]:
    """A's own noise and A in B's precision, replayed (on a fresh A, after B) only for the span
    records B's replay departed from: a span B reproduced byte for byte is within any floor, so
    its floors decide nothing. With a carried state every record replays, in order (each side
    carries it from its first version). Returns both, their seconds and the records replayed."""
    t0 = time.perf_counter()
    if prec.carried:
        keep = rec.records
    else:
        off = {(r.span, r.step) for r in runs if r.outside or r.absent or any(not e.identical for e in r.errs.values())}
        keep = [r for r in rec.records if (r.span, r.step) in off]
    if not keep:
        return [], [], 0.0, 0.0, 0
    sub = dataclasses.replace(rec, records=keep)
    io = open_a()
    noise, tn = replay(io, "a", diff, sub, prec)
    sim, ts = replay(io, "a", diff, sub, prec, np.random.Generator(np.random.PCG64(seed)))
    return noise, sim, time.perf_counter() - t0 - ts, ts, len(keep)
