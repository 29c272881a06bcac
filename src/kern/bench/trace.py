"""A trace of served steps (`kern serve --trace FILE`) and the bench workload it becomes.

The trace is JSON lines: a header `{"kern_trace": 1, "model": ...}`, then one line per program
run, `{"program": P, "rows": [rows of each sequence], "start": [the position of each
sequence's first row], "t": the host's monotonic clock}`, written as the engine runs it (a
decode padded to a captured batch size counts its padding rows: they are what ran). `--workload` takes such a file as it takes
a TOML one. Each step becomes a shape: its sequences, their rows (the step's rows over its
sequences, rounded up to a power of two, or to the most the prefill program steps that many
sequences, as the step that ran did: kern.bench.scenario.plan) and their context (the mean start, rounded up to a
power of two; 0 stays 0); a shape's weight is how many steps it stands for. Reading is pure."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import IO

import numpy as np

from .workload import Shape, Workload, WorkloadError

VERSION = 1


def pow2(n: int) -> int:
    return 0 if n <= 0 else 1 << (n - 1).bit_length()


def is_trace(text: str) -> bool:
    """A trace starts with a JSON object; a TOML workload cannot."""
    return text.lstrip()[:1] == "{"


def parse(text: str, path: str = "trace") -> Workload:
    lines = [(i + 1, ln) for i, ln in enumerate(text.splitlines()) if ln.strip()]
    steps = []
    for k, (no, ln) in enumerate(lines):
        where = f"{path}: line {no}"
        try:
            rec = json.loads(ln)
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"{where}: not JSON ({exc.msg})") from None
        if not isinstance(rec, dict):
            raise WorkloadError(f"{where}: expected a JSON object")
        if k == 0:
            if rec.get("kern_trace") != VERSION:
                raise WorkloadError(f"{where}: not a kern serve trace (its first line holds \"kern_trace\": {VERSION})")
            continue
        rows, start = rec.get("rows"), rec.get("start")
        ok = (isinstance(rows, list) and isinstance(start, list) and rows and len(rows) == len(start)
              and all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in rows)
              and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in start))
        if not ok:
            raise WorkloadError(f"{where}: expected \"rows\" (whole numbers >= 1) and \"start\" (whole numbers "
                                ">= 0), one of each a sequence")
        steps.append((len(rows), pow2(-(-sum(rows) // len(rows))), pow2(round(float(np.mean(start))))))
    if not steps:
        raise WorkloadError(f"{path}: the trace holds no steps")
    counts = Counter(steps)
    shapes = tuple(Shape(g, r, c, float(n), traced=True) for (g, r, c), n in sorted(counts.items()))
    return Workload(path, 5, 0, shapes, ({"trace": path, "steps": len(steps)},))


def open_trace(path: str | Path, model: str, flag: str) -> IO[str]:
    """A trace file opened and its header written; `flag` names the setting that asked for it
    in the one-line error a path that cannot be written gets."""
    try:
        out = open(path, "w", encoding="utf-8")  # noqa: SIM115 (open for the server's life)
    except OSError as exc:
        from ..errors import KernError

        raise KernError(f"{flag} {path}: cannot write ({exc.strerror or exc})") from None
    out.write(json.dumps({"kern_trace": VERSION, "model": model}) + "\n")
    out.flush()
    return out


def write_step(out: IO[str], program: str, rows: list[int], start: list[int], t: float | None = None) -> None:
    """One program run: its sequences' rows and first positions, and `t`, the host's monotonic
    clock as the run was handed to the device (seconds; the gaps between runs are what serving
    paid a step: bench/trace_steps.py; nothing reads it to decide a result), flushed so that a
    server stopped at any moment leaves a trace that reads."""
    rec = {"program": program, "rows": [int(x) for x in rows], "start": [int(x) for x in start]}
    if t is not None:
        rec["t"] = round(t, 6)
    out.write(json.dumps(rec) + "\n")
    out.flush()


class Writer:
    """Appends one line per program run of an engine (Engine.observers)."""

    def __init__(self, engine, out: IO[str]):
        self.out = out
        self.steppers = {st.program: st for st in engine.protocol.steppers}

    def __call__(self, program: str, env: dict[str, int], inputs: dict[str, np.ndarray]) -> None:
        st = self.steppers.get(program)
        pos = inputs.get(st.inputs.get("position", "")) if st is not None else None
        if pos is None:  # not a serving step (a once program) or one that writes no positions
            return
        pos = np.asarray(pos).reshape(-1)
        cu = inputs.get(st.inputs.get("cu_seqlens", ""))
        if cu is None:  # one row a sequence
            rows, start = [1] * pos.size, pos.tolist()
        else:
            cu = np.asarray(cu).reshape(-1)
            groups = env.get(st.groups_var, cu.size - 1) if st.groups_var else cu.size - 1
            rows = np.diff(cu[:groups + 1]).tolist()
            start = [int(pos[a]) for a in cu[:groups].tolist()]
        write_step(self.out, program, rows, start, time.monotonic())


def record(engine, path: str | Path) -> Writer:
    """Trace every step the engine runs from now on into `path` (kern serve --trace)."""
    w = Writer(engine, open_trace(path, engine.m.model, "--trace"))
    engine.observers.append(w)
    return w
