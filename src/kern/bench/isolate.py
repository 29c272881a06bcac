"""--isolate: each distinct call (same op, view shapes and dtypes, scalar values) timed alone.

The program is walked call by call from the scenario's real context (its states as the whole
run found them: a recurrent state is not idempotent, a KV cache is); before each distinct
call's first occurrence, the buffers it touches and the used prefix of the states are
snapshotted. A gate compares the walk's outputs (poisoned first) with the whole program's,
byte for byte: a walk that does not reproduce the program times something else, and the
command fails. Each sample restores the snapshot first; a warm sample runs the call once
untimed before, a cold one evicts the caches (timers.py) before."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..drive.engine_io import EngineIO, poison
from ..manifest.expr import evaluate
from ..runtime.engine import Engine
from ..runtime.lower import Scalar, StateRef, View
from .attribution import call_bytes
from .timers import stats


def call_key(launches, env: dict[str, int], op: str) -> str:
    parts = []
    for l in launches:
        for a in l.args:
            if isinstance(a, View):
                parts.append(f"{a.dtype}{[evaluate(d, env) for d in a.shape]}")
            elif isinstance(a, StateRef):
                parts.append("state")
            elif isinstance(a, Scalar):
                parts.append(repr(a.value if isinstance(a.value, (int, float)) else evaluate(a.value, env)))
    return f"{op}({', '.join(parts)})"


def _outputs(engine: Engine, stepper, env) -> dict[str, bytes]:
    return {role: engine.read(buf, env).tobytes() for role, buf in stepper.outputs.items()}


def isolate(timer, engine: Engine, stepper, vars: dict[str, int], inputs: dict[str, np.ndarray], pages: int,
            samples: int, tick: Callable[[], None] = lambda: None,
            more: Callable[[int], None] = lambda n: None) -> dict:
    program = stepper.program
    slots = vars.get(stepper.groups_var, stepper.groups_max) if stepper.groups_var else stepper.groups_max
    io = EngineIO(engine)
    # the walk starts from the states the whole run started from: a recurrence's slot, unlike
    # a KV cache's pages, is not the same after a step runs twice
    written = {a.state for l in io.launches(program, 0, len(engine.m.programs[program].calls)) for a in l.args
               if isinstance(a, StateRef)}
    before = {s: io.read_state(s, io.state_prefix(s, pages, slots)) for s in sorted(written)}
    env = engine.run(program, vars, inputs)
    engine.device.synchronize()
    whole = _outputs(engine, stepper, env)
    for s, x in before.items():
        io.write_state(s, x)
    calls = engine.m.programs[program].calls
    for buf in stepper.outputs.values():  # what the walk does not write again must show
        io.write(buf, poison(engine.m.buffers[buf].dtype, io.extent(buf, env)))
    reps: dict[str, list[int]] = {}
    snaps: dict[int, tuple[dict, dict]] = {}
    for ci in range(len(calls)):
        ls = io.launches(program, ci, ci + 1)
        key = call_key(ls, env, calls[ci].op)
        if key not in reps:
            bufs = {a.buffer for l in ls for a in l.args
                    if isinstance(a, View) and engine.m.buffers[a.buffer].kind != "weight"}
            sts = {a.state for l in ls for a in l.args if isinstance(a, StateRef)}
            snaps[ci] = ({b: io.read(b, io.extent(b, env, ls)) for b in sorted(bufs)},
                         {s: io.read_state(s, io.state_prefix(s, pages, slots)) for s in sorted(sts)})
        reps.setdefault(key, []).append(ci)
        io.run_calls(program, ci, ci + 1, env)
    walked = _outputs(engine, stepper, env)
    differ = sorted(r for r in whole if whole[r] != walked.get(r))
    gate = {"ok": not differ, "what": ("the call-by-call walk reproduces the program's outputs byte for byte"
                                       if not differ else f"the walk's {', '.join(differ)} differ from the "
                                       "whole program's")}
    nbytes = call_bytes(engine, program, env)
    more(len(reps) * samples)
    out = []
    for key, idx in reps.items():
        ci = idx[0]
        bufs, sts = snaps[ci]

        def restore() -> None:
            for b, x in bufs.items():
                io.write(b, x)
            for s, x in sts.items():
                io.write_state(s, x)

        warm, cold = [], []
        for _ in range(samples):
            restore()
            timer.call(program, ci, env)
            restore()
            warm.append(timer.call(program, ci, env))
            restore()
            timer.evict()
            cold.append(timer.call(program, ci, env))
            tick()
        out.append({"key": key, "op": calls[ci].op, "calls": idx, "bytes": nbytes[ci],
                    "warm_us": stats(warm), "cold_us": stats(cold)})
    return {"gate": gate, "calls": out}
