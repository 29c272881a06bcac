"""Pipeline stages across devices: `kern cut`'s stages of one manifest, stage k on device k (cpu:
a `CpuDevice` a stage, as the cpu ranks of a split deployment; cuda: GPU k), one thread a stage,
behind the Engine's face (`kern serve --pp N`, `kern run --pp N`, `kern.load(pp=N)`).

A step of a decode program (b groups of one row) is cut into micro-batches of contiguous groups
(`micro_batches`, default one a stage). Each stage's thread runs the micro-batches in order; stage
k starts micro-batch j as soon as every stage it receives from has finished j and every stage it
sends to has taken j - 1, so stage k works on j while stage k + 1 works on j - 1. The
activations at a cut (the buffers kern cut's plan says a stage sends) go from the sender's
buffer into the receiver's by a peer copy (cuda: cuMemcpyPeerAsync on the receiver's stream;
cpu: a copy between the stages' host memory), once a micro-batch, only the micro-batch's bytes.
A program whose inputs are not all laid out by group (prefill: ragged rows; speculative rounds)
runs its step as one micro-batch through the stages. run_steps (the loop's run-ahead: steps
whose tokens feed the next) is one flow over the steps' micro-batches: micro-batch i of step
s + 1 starts as soon as micro-batch i of step s is sampled, so the stages stay busy across steps.

Why the tokens are the one device's, bit for bit: every stage runs exactly the uncut manifest's
calls in order (kern cut's guarantee, judged by kern test), and a micro-batch is a batch of
fewer groups, which batch-invariant kernels give the same bytes a row. The outputs of a
micro-batched step are gathered into one step-sized buffer on the last stage's device (a
device copy a micro-batch), which the host loop reads as it reads one engine's outputs.

The pool: every stage keeps the states its calls touch whole (kern cut), so the stages that
hold states must hold the same ones (one pool layout); the loop's one `Paging` runs its plans
on each of them. A stage with no state (only the LM head, say) holds no pool. No host tier."""

from __future__ import annotations

import json
import threading
from math import prod
from pathlib import Path

import numpy as np

from ..manifest.expr import evaluate
from ..cut.plan import CutError, CutPlan, plan, stage_manifest
from ..manifest.protocol import derive
from ..manifest.schema import DTYPE_BYTES
from ..manifest.verify import Verified, verify_text
from ..runtime.dtypes import NP
from ..runtime.engine import DEFAULT_STATE_BUDGET, Engine
from ..errors import BoundsError
from ..runtime.paging import Paging
from .ranks import OnThreads, Workers, open_parts
from . import stage_links
from .stage_links import StageError, link, micro_inputs, peer_copy

WAIT_S = 600.0  # a stage that never hands over (it failed on another thread): an error, not a hang


def cut_stages(v: Verified, n: int) -> tuple[list[Verified], CutPlan]:
    """The `n` stage manifests of `v` (verified, in memory: their modules resolve from v's folder)
    and kern cut's plan, or one StageError saying why this deployment does not pipeline."""
    if v.manifest.topology.ranks > 1:
        raise StageError(f"--pp {n}: {v.manifest.topology.ranks}-rank deployment (--tp or --ep): pipeline "
                         "stages of a split deployment are not supported yet; give --pp or --tp/--ep, not both")
    try:
        p = plan(v, n)
    except CutError as exc:
        raise StageError(f"--pp {n}: {exc}") from None
    for prog in {s.program for s in p.segments}:
        empty = [s.stage for s in p.of(prog) if s.hi <= s.lo]
        if empty:
            raise StageError(f"--pp {n}: program {prog!r} has no calls in stage {empty[0]} (its calls are too few "
                             "to cut, e.g. one launch a step): this deployment does not pipeline over "
                             f"{n} devices")
    out = []
    for k in range(n):
        doc = stage_manifest(v, p, k)
        for b in {b for s in p.segments if s.stage == k for b in s.receives}:
            if doc["buffers"][b]["kind"] == "input":  # written by the peer copy, not the caller
                doc["buffers"][b]["kind"] = "carry"
        kept, whole = sorted(doc["states"]), sorted(v.manifest.states)
        if kept and kept != whole:
            raise StageError(f"--pp {n}: stage {k} keeps states {', '.join(kept)} of the deployment's "
                             f"{', '.join(whole)}: the stages share one pool, so a stage keeps every state or "
                             "none; this deployment does not pipeline yet")
        r = verify_text(json.dumps(doc), f"{v.base_dir}: stage {k} of {n}", v.base_dir)
        if r.verified is None:
            raise StageError(f"--pp {n}: stage {k} does not verify (a kern cut bug): {r.problems[0]}")
        out.append(r.verified)
    return out, p


def _layout(e: Engine):
    lay = e.pool.layout
    return tuple(lay.kinds), lay.chunk_bytes, lay.page_tokens


class StagedEngine(OnThreads):
    """N stages' engines, one device and one thread each, behind the Engine's face."""

    def __init__(self, v: Verified, weights: str | Path | None, stages: int, *,
                 state_budget: int | None = DEFAULT_STATE_BUDGET, paged: bool = False, host_bytes: int | None = 0,
                 ordinals: list[int] | None = None, micro_batches: int | None = None):
        if host_bytes:
            raise StageError(f"--pp {stages}: the host tier holds one device's pages: a pipelined deployment runs "
                             "without it (host memory 0)")
        state_budget = DEFAULT_STATE_BUDGET if state_budget is None else state_budget
        self.v, self.m, self.consts = v, v.manifest, v.constants
        self.protocol = derive(v)
        self.max_env = {**self.consts, **{n: var.max for n, var in self.m.vars.items()}}
        self.shapes = {n: tuple(evaluate(d, self.max_env) for d in b.shape) for n, b in self.m.buffers.items()}
        sv, self.plan = cut_stages(v, stages)
        ordinals = ordinals or stage_links.ordinals(sv[0], stages)
        self.micro_batches = micro_batches or stages
        self.workers = Workers(stages)
        self.stages: list[Engine] = open_parts(self.workers, lambda k: (sv[k], ordinals[k], {
            "state_budget": state_budget, "paged": paged and bool(sv[k].manifest.states), "own_paging": False}),
            weights)
        try:  # a refusal here gives the stages' memory back, as a failed load does
            link(self.stages, self.workers)
            held = [e for e in self.stages if e.pool is not None]
            for k, e in enumerate(self.stages):
                if e.pool is not None and _layout(e) != _layout(held[0]):
                    raise StageError(f"--pp {stages}: stage {k} keeps states {sorted(e.m.states)}, stage "
                                     f"{self.stages.index(held[0])} {sorted(held[0].m.states)}: one pool needs every "
                                     "stage's alike (cut elsewhere, or this family does not pipeline yet)")
        except BaseException:
            self.close()
            raise
        e0 = held[0] if held else self.stages[0]
        self.device = self.stages[0].device
        self.memory_note = getattr(e0, "memory_note", "state memory")
        self.launches = {p: [la for e in self.stages for la in e.launches.get(p, [])] for p in self.m.programs}
        self.observers: list = []  # told of every step once, on the caller's thread
        self.paging = Paging(e0.pool, self) if e0.pool is not None else None
        self._writer = {p: self._writers(p) for p in {s.program for s in self.plan.segments}}
        self._gathered: dict[tuple[int, str], object] = {}  # (stage, output) -> a step-sized buffer
        self._last: dict[str, tuple[int, object | None]] = {}  # output -> (stage, gathered buffer or None)

    def _parts(self) -> list[Engine]:
        return self.stages

    # ---- the face's arithmetic: the uncut manifest's ---------------------------------------
    env = Engine.env
    shape = Engine.shape
    domain = Engine.domain

    def page_bytes(self, state: str) -> int:
        return next(e.page_bytes(state) for e in self.stages if state in e.m.states)

    def runs_steps_natively(self, program: str) -> bool:
        """As the stages' device: on cuda each stage's steps are graphs (the loop buckets its
        batch sizes, captures them at start-up and runs ahead, run_steps pipelining the steps'
        micro-batches); on the cpu the loop steps one at a time."""
        return self.stages[0].runs_steps_natively(program)

    def _writers(self, program: str) -> dict[str, int]:
        """Output -> the stage that writes it last in `program` (where the host loop reads it)."""
        out = {}
        for s in self.plan.of(program):
            if s.hi > s.lo:
                e = self.stages[s.stage]
                for c in e.m.programs[program].calls:
                    for a in c.args:
                        name = getattr(a, "buf", None)
                        if name in self.m.buffers and self.m.buffers[name].kind == "output" and \
                                e.m.buffers[name].kind != "input":
                            out[name] = s.stage
        return out

    # ---- stepping -------------------------------------------------------------------------
    def _split(self, program: str, vars: dict[str, int], inputs: dict[str, np.ndarray]) -> list[tuple[int, int]]:
        """The step's micro-batches as group ranges [lo, hi): several where the program steps
        groups of one row and every input and output is laid out by group, else one."""
        st = next((s for s in self.protocol.steppers if s.program == program), None)
        gvar = st.groups_var if st is not None and st.rows == 1 else None
        n = vars.get(gvar, 0) if gvar else 0
        cu = st.inputs.get("cu_seqlens") if st is not None else None  # a group a row: 0, 1, .., n
        by_group = all(list(self.m.buffers[b].shape[:1]) == [gvar] for b in [*inputs, *self._writer[program]]
                       if b != cu)
        m = min(self.micro_batches, n) if gvar and by_group else 1
        if m <= 1:
            return [(0, n)]
        sizes = [n // m + (i < n % m) for i in range(m)]
        return [(sum(sizes[:i]), sum(sizes[:i + 1])) for i in range(m)]

    def _check(self, program: str, vars: dict[str, int], inputs: dict[str, np.ndarray]) -> tuple[dict, list]:
        """The step's env and the stages that take part, the whole step checked by every one of
        them before any runs (a bad step is refused once, nothing written)."""
        if program not in self._writer:
            raise BoundsError(f"no program named {program!r}; the pipeline steps {', '.join(self._writer)}")
        env = self.env(program, vars)
        for b in inputs:
            if b not in self.m.buffers:
                raise BoundsError(f"program {program!r}: no buffer named {b!r}")
        segs = [s for s in self.plan.of(program) if s.hi > s.lo]
        for s in segs:
            self._checked(s.stage, program, vars, inputs)
        return env, segs

    def _checked(self, k: int, program: str, vars: dict[str, int], inputs: dict[str, np.ndarray]):
        e = self.stages[k]
        return e.checked(program, {n: x for n, x in vars.items() if n in e.m.vars},
                         {b: x for b, x in inputs.items() if b in e.m.buffers and e.m.buffers[b].kind == "input"})

    def _part(self, program: str, vars: dict[str, int], inputs: dict[str, np.ndarray], parts: list, i: int):
        """Micro-batch i's vars and inputs."""
        if len(parts) == 1:
            return vars, inputs
        st = next(s for s in self.protocol.steppers if s.program == program)
        lo, hi = parts[i]
        return {**vars, st.groups_var: hi - lo}, micro_inputs(inputs, lo, hi, st.inputs.get("cu_seqlens"))

    def run(self, program: str, vars: dict[str, int], inputs: dict[str, np.ndarray] | None = None,
            wait: bool = True) -> dict[str, int]:
        """One step through every stage, micro-batched; checked whole before any stage runs."""
        inputs = dict(inputs or {})
        env, segs = self._check(program, vars, inputs)
        for see in self.observers:
            see(program, env, inputs)
        parts = self._split(program, vars, inputs)
        tickets = [{s.stage: self._checked(s.stage, program, *self._part(program, vars, inputs, parts, i))
                    for s in segs} for i in range(len(parts))]
        self._flow(program, segs, parts, 1, lambda k, t, wait_for: tickets[t][k])
        return env

    def _flow(self, program: str, segs: list, parts: list[tuple[int, int]], steps: int, make, after=None) -> None:
        """Every stage's thread runs the tickets (step j's micro-batch i is ticket j * m + i) in
        order, handing activations over (above). make(k, t, wait_for): stage k's checked step of
        ticket t (it may wait for an earlier ticket's outputs); after(k, t, engine, env): once
        stage k has run ticket t."""
        stage_at = {s.stage: i for i, s in enumerate(segs)}
        # (receiver, buffer) -> the newest earlier stage that sends it (a middle stage may receive
        # and send a buffer of the same name: the residual stream)
        sender = {(r.stage, b): max(s.stage for s in segs if s.stage < r.stage and b in s.sends)
                  for r in segs for b in r.receives}
        receivers = {s.stage: sorted({r for (r, b), k in sender.items() if k == s.stage}) for s in segs}
        writer = self._writer[program]
        m = len(parts)
        done = {s.stage: 0 for s in segs}  # tickets a stage has finished
        taken = {s.stage: -1 for s in segs}  # the last ticket whose activations a stage has copied in
        cv = threading.Condition()
        failed: list[BaseException] = []

        def wait_for(cond) -> None:
            with cv:
                if not cv.wait_for(lambda: failed or cond(), timeout=WAIT_S):
                    raise StageError(f"a pipeline stage waited {WAIT_S:.0f} s for another: stopped")
                if failed:
                    raise StageError("another pipeline stage failed")

        def stage(k: int) -> None:
            if k not in stage_at:
                return
            seg, e = segs[stage_at[k]], self.stages[k]
            try:
                for t in range(steps * m):
                    lo, hi = parts[t % m]
                    wait_for(lambda: all(taken[r] >= t - 1 for r in receivers[k]))
                    wait_for(lambda: all(done[sender[k, b]] > t for b in seg.receives))
                    step = make(k, t, wait_for)
                    for b in seg.receives:
                        peer_copy(e, b, self.stages[sender[k, b]], b, e._step_bytes(b, step.env))
                    with cv:
                        taken[k] = t
                        cv.notify_all()
                    e.run_checked(step)
                    if m > 1:
                        for b in (b for b, w in writer.items() if w == k):
                            row = prod(self.shapes[b][1:]) * DTYPE_BYTES[self.m.buffers[b].dtype]
                            peer_copy(e, self._gather_buffer(k, b), e, b, (hi - lo) * row, dst_offset=lo * row)
                    if after is not None:
                        after(k, t, e, step.env)
                    with cv:
                        done[k] = t + 1
                        cv.notify_all()
            except BaseException as exc:
                with cv:
                    if not isinstance(exc, StageError) or not failed:
                        failed.append(exc)
                    cv.notify_all()
                raise

        try:
            self.workers.each(stage)
        except StageError:
            if failed and not isinstance(failed[0], StageError):
                raise failed[0] from None  # the stage that failed first, not one that gave up on it
            raise
        # kept per output, across programs: the loop may run another program before it reads these
        self._last.update({b: (w, self._gathered[(w, b)] if m > 1 else None) for b, w in writer.items()})

    def _gather_buffer(self, k: int, b: str):
        """A step-sized buffer on stage k's device that a micro-batched step's output `b` is gathered in."""
        if (k, b) not in self._gathered:
            dt = self.m.buffers[b].dtype
            self._gathered[(k, b)] = self.stages[k].device.alloc(dt, prod(self.shapes[b]))
        return self._gathered[(k, b)]

    def run_steps(self, program: str, vars: dict[str, int], inputs: dict[str, np.ndarray],
                  steps: list[dict[str, np.ndarray]], feedback: dict[str, str], collect: list[str],
                  each=None) -> list[dict[str, np.ndarray]]:
        """Engine.run_steps (1 + len(steps) steps, step j's `feedback` inputs from step j - 1's
        outputs) as one flow of tickets: micro-batch i of step j starts in stage 0 as soon as
        the last stage has finished micro-batch i of step j - 1 (its tokens fed back through the
        host), so with at least as many micro-batches as stages every stage stays busy across
        the steps. Every ticket writes every input of its micro-batch (a micro-batch's buffers
        hold only its part). The outputs of `collect` and `feedback` are read a micro-batch at a
        time and returned a step at a time; `each` is told of each step once all have run."""
        inputs = dict(inputs)
        collect = list(dict.fromkeys([*collect, *feedback]))
        env, segs = self._check(program, vars, inputs)
        for b in collect:
            if b not in self._writer[program]:
                raise BoundsError(f"program {program!r}: {b!r} is not an output the program writes")
        for see in self.observers:
            for j in range(1 + len(steps)):
                see(program, env, {**inputs, **steps[j - 1]} if j else inputs)
        parts = self._split(program, vars, inputs)
        m = len(parts)
        got: dict[int, dict[str, np.ndarray]] = {}  # ticket -> its collected outputs (host)
        writer = self._writer[program]
        lock = threading.Lock()

        def make(k: int, t: int, wait_for):
            j, i = divmod(t, m)
            step = dict(inputs)
            if j:
                step.update(steps[j - 1])
            tv, mine = self._part(program, vars, step, parts, i)
            e = self.stages[k]
            fed = [(s, d) for s, d in feedback.items() if d in e.m.buffers and e.m.buffers[d].kind == "input"]
            if j and fed:
                wait_for(lambda: t - m in got and all(s in got[t - m] for s, _ in fed))
                mine = {**mine, **{d: got[t - m][s] for s, d in fed}}
            return self._checked(k, program, tv, mine)

        def after(k: int, t: int, e: Engine, step_env: dict[str, int]) -> None:
            mine = {c: e.read(c, step_env) for c in collect if writer[c] == k}
            with lock:
                got.setdefault(t, {}).update(mine)

        self._flow(program, segs, parts, 1 + len(steps), make, after)
        outs = [{c: np.concatenate([got[j * m + i][c] for i in range(m)]) for c in collect}
                for j in range(1 + len(steps))]
        if each is not None:
            for j, o in enumerate(outs):
                each(j, o)
        return outs

    # ---- reading: the stage that wrote an output last (or its gathered copy) -----------------
    def _source(self, buffer: str) -> tuple[Engine, object]:
        if buffer in self._last:
            k, gathered = self._last[buffer]
            e = self.stages[k]
            return e, gathered if gathered is not None else e.buffers[buffer]
        e = next(e for e in reversed(self.stages) if buffer in e.buffers)
        return e, e.buffers[buffer]

    def read(self, buffer: str, env: dict[str, int]) -> np.ndarray:
        e, store = self._source(buffer)
        return self.workers.on(self.stages.index(e), lambda: e.device.read(
            store, self.m.buffers[buffer].dtype, self.shape(buffer, env)))

    def read_rows(self, buffer: str, env: dict[str, int], rows: list[int]) -> np.ndarray:
        e, store = self._source(buffer)
        shape = self.shape(buffer, env)
        width, dt = prod(shape[1:]), self.m.buffers[buffer].dtype

        def rows_of() -> np.ndarray:
            out = np.empty((len(rows), *shape[1:]), NP[dt])
            for j, r in enumerate(rows):
                out[j] = e.device.read(store, dt, shape[1:], r * width)
            return out

        return self.workers.on(self.stages.index(e), rows_of)

    # ---- the pool's plans: every stage holding the state -----------------------------------
    def remap_state(self, state: str, unmap: list[int], map: list[tuple[int, int]]) -> None:
        self.workers.each(lambda k: self.stages[k].remap_state(state, unmap, map)
                          if state in self.stages[k].states else None)

    def copy_state(self, state: str, dst: int, src: int, nbytes: int) -> None:
        self.workers.each(lambda k: self.stages[k].copy_state(state, dst, src, nbytes)
                          if state in self.stages[k].states else None)

    def read_state(self, state: str, offset: int, nbytes: int) -> np.ndarray:
        raise StageError("a pipelined deployment has no host tier: its pages are not parked")

    def write_state(self, state: str, offset: int, data: np.ndarray) -> None:
        raise StageError("a pipelined deployment has no host tier: its pages are not parked")
