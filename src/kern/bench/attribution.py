"""Time attributed to every call inside the real program.

Each sample walks the whole program, in order, with a clock around every call's launches
(timers.py). The walk's own total is kept beside it, so the sum of the calls is checked
against the step it came from, and the untraced step (a graph replay where the program is
captured) is timed on its own. Each call's bytes are those of the buffer and
weight views its launches pass (states are opaque: their bytes are not counted)."""

from __future__ import annotations

from collections.abc import Callable
from math import prod

import numpy as np

from ..manifest.expr import evaluate
from ..manifest.schema import DTYPE_BYTES
from ..runtime.engine import Engine
from ..runtime.lower import View
from .timers import stats


def call_bytes(engine: Engine, program: str, env: dict[str, int]) -> list[int]:
    """Bytes each call's launches pass through buffer views at this step's shape (each view
    counted once per call)."""
    out = [0] * len(engine.m.programs[program].calls)
    seen: set[tuple] = set()
    for l in engine.launches[program]:
        for a in l.args:
            if isinstance(a, View):
                key = (l.call, a.buffer, repr(a.offset), repr(a.shape))
                if key not in seen:
                    seen.add(key)
                    out[l.call] += prod(evaluate(d, env) for d in a.shape) * DTYPE_BYTES[a.dtype]
    return out


def measure(timer, engine: Engine, program: str, vars: dict[str, int], samples: int, ceiling_gbps: float,
            tick: Callable[[], None] = lambda: None) -> dict:
    """Per-call stats, per-op totals and the step total of one scenario (its inputs written)."""
    calls = engine.m.programs[program].calls
    owner = [l.call for l in engine.launches[program]]
    env = engine.env(program, vars)
    per_call: list[list[float]] = [[] for _ in calls]
    walks, attributed, steps = [], [], []
    timer.step(program, vars)  # warm: first-touch, lowering and graph capture are not the step
    timer.walk(program, vars)
    for _ in range(samples):
        call_us, walk_us = timer.walk(program, vars)
        for ci, us in enumerate(call_us):
            per_call[ci].append(us)
        walks.append(walk_us)
        attributed.append(sum(call_us))
        steps.append(timer.step(program, vars))
        tick()
    nbytes = call_bytes(engine, program, env)
    rows = []
    for ci, (c, xs) in enumerate(zip(calls, per_call)):
        st = stats(xs)
        gbps = nbytes[ci] / st["p50"] / 1e3 if st["p50"] > 0 else 0.0
        rows.append({"call": ci, "op": c.op, "where": f"programs.{program}.calls[{ci}] (op {c.op})",
                     "launches": owner.count(ci), "bytes": nbytes[ci], "us": st, "gbps": gbps,
                     "ceiling_share": gbps / ceiling_gbps if ceiling_gbps > 0 else 0.0})
    return {"program": program, "program_calls": len(calls), "samples": samples,
            "step": {"untraced_us": stats(steps), "walk_us": stats(walks), "attributed_us": stats(attributed),
                     # per sample: the calls' sum against the walk they were timed in
                     "attributed_share": float(np.median([a / w if w > 0 else 0.0 for a, w in zip(attributed, walks)])),
                     "attributed_within_walk": all(a <= w for a, w in zip(attributed, walks))},
            "calls": rows, "ops": by_op(rows)}


def by_op(rows: list[dict]) -> list[dict]:
    """Totals by op (sum of the calls' p50), largest first, each with its share of the step."""
    total = sum(r["us"]["p50"] for r in rows) or 1.0
    ops: dict[str, list] = {}
    for r in rows:
        o = ops.setdefault(r["op"], [0, 0.0, 0])
        o[0] += 1
        o[1] += r["us"]["p50"]
        o[2] += r["bytes"]
    out = [{"op": op, "calls": n, "us": us, "share": us / total, "bytes": b} for op, (n, us, b) in ops.items()]
    return sorted(out, key=lambda o: -o["us"])
