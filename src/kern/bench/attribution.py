"""Time attributed to every call inside the real program, checked against the whole step.

The timer gives per-sample times of every call and of the whole untraced step (timers.py:
on the CPU a clock around each launch of a run; on CUDA the program cut after each call,
prefix.py). The check: the calls' p50 summed lies within CHECK of the untraced step's p50.
Each call's bytes are those of the buffer and weight views its launches pass (states are
opaque: their bytes are not counted)."""

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


CHECK = 0.05  # the calls' sum against the whole step: the issue's bound


def check(calls: list[float], steps: list[float]) -> dict:
    """The calls' sum of each sample against the untraced step run beside it, the median of
    those ratios: a machine whose load drifts (other processes on a shared CPU) moves both
    halves of a pair alike, where the two medians taken apart would drift apart."""
    ratios = [c / s for c, s in zip(calls, steps) if s > 0]
    ratio = float(np.median(ratios)) if ratios else 0.0
    return {"calls_us": float(np.median(calls)), "step_us": float(np.median(steps)), "ratio": ratio,
            "within": CHECK, "ok": abs(ratio - 1.0) <= CHECK}


def measure(timer, engine: Engine, program: str, vars: dict[str, int], samples: int, ceiling_gbps: float,
            tick: Callable[[], None] = lambda: None) -> dict:
    """Per-call stats, per-op totals and the step total of one scenario (its inputs written)."""
    calls = engine.m.programs[program].calls
    owner = [l.call for l in engine.launches[program]]
    env = engine.env(program, vars)
    timer.step(program, vars)  # warm: first-touch, lowering and graph capture are not the step
    got = timer.attribute(program, vars, samples, tick)
    nbytes = call_bytes(engine, program, env)
    rows = []
    for ci, (c, xs) in enumerate(zip(calls, got.calls)):
        st = stats(xs)
        gbps = nbytes[ci] / st["p50"] / 1e3 if st["p50"] > 0 else 0.0
        rows.append({"call": ci, "op": c.op, "where": f"programs.{program}.calls[{ci}] (op {c.op})",
                     "launches": owner.count(ci), "bytes": nbytes[ci], "us": st, "gbps": gbps,
                     "ceiling_share": gbps / ceiling_gbps if ceiling_gbps > 0 else 0.0})
    step = stats(got.step)
    sums = [sum(x) for x in zip(*got.calls)]  # each sample's calls, paired with its step
    return {"program": program, "program_calls": len(calls), "samples": samples,
            "step": {"untraced_us": step, "host_us": stats(got.host), "base_us": stats(got.base),
                     "calls_us": stats(sums),
                     "check": check(sums, list(got.step)), "method": got.method},
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
