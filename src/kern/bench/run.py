"""kern bench end to end: load, measure the device's copy ceiling, then each scenario: build its
context with the prefill program, time every call of the measured program (and, with
isolate, every distinct call alone). Returns the JSON document report.py shows."""

from __future__ import annotations

import gc
import hashlib
import sys
import time
from pathlib import Path

from ..drive.engine_io import EngineIO
from ..judge.diff import diff
from ..manifest.protocol import derive
from ..manifest.verify import load_verified
from ..runtime.engine import DEFAULT_STATE_BUDGET, Engine
from . import scenario
from .attribution import measure
from .compare import compare
from .isolate import isolate as isolate_calls
from .timers import timer_for
from .workload import Workload

SCHEMA = 1


def manifest_file(path: str | Path) -> Path:
    p = Path(path)
    return p / "manifest.json" if p.is_dir() else p


def _bar(total: int, desc: str, progress: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="sample", file=sys.stderr,
                disable=None if progress else True, leave=False)  # None: only on a terminal


def bench(manifest: str | Path, weights: str | Path | None, wl: Workload, *, isolate: bool = False,
          samples: int | None = None, state_budget: int | None = None, progress: bool = True) -> dict:
    """`state_budget`: each state's budget in bytes (default: what the workload's largest shape needs)."""
    path = manifest_file(manifest)
    v = load_verified(path)
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    n = samples or wl.samples
    budget = state_budget or scenario.state_budget(v, derive(v), wl.shapes) or DEFAULT_STATE_BUDGET
    engine = Engine(v, weights, state_budget=budget)
    timer = timer_for(engine)
    ceiling = timer.ceiling_gbps()
    lim = EngineIO(engine).limits()
    scenarios, dropped = [], []
    for shape in wl.shapes:
        sc = scenario.plan(shape, engine.protocol, lim, wl.seed)
        if isinstance(sc, str):
            dropped.append({"groups": shape.groups, "rows": shape.rows, "context": shape.context,
                            **({"round": True} if shape.round else {}), "why": sc})
        else:
            scenarios.append(sc)
    out = []
    with _bar(len(scenarios) * n, f"kern bench {path.parent.name}", progress) as bar:
        def more(k: int) -> None:  # isolate's distinct calls are known once its walk is done
            bar.total += k
            bar.refresh()

        t0 = time.monotonic()
        for i, sc in enumerate(scenarios):
            if progress:  # a line a shape, terminal or not: a CPU run of a few shapes takes minutes
                bar.write(f"[kern] bench: shape {i + 1} of {len(scenarios)}, {sc.program} {sc.shape.groups} x "
                          f"{sc.shape.rows} rows at context {sc.shape.context} ({time.monotonic() - t0:.0f} s so far)",
                          file=sys.stderr)
            vars, ins = scenario.prepare(engine, sc)
            engine.run(sc.program, vars, ins)
            row = {"groups": sc.shape.groups, "rows": sc.shape.rows, "context": sc.shape.context,
                   "weight": sc.shape.weight, **({"round": True} if sc.shape.round else {})}
            row.update(measure(timer, engine, sc.program, vars, n, ceiling, lambda: bar.update(1)))
            if isolate:
                pages = sum(len(s.pages) for s in sc.seqs)
                row["isolate"] = isolate_calls(timer, engine, sc.stepper, vars, ins, pages, n, lambda: bar.update(1),
                                               more)
            out.append(row)
    doc = {"kern_bench": SCHEMA, "model": v.manifest.model, "manifest": {"path": str(path), "sha256": sha},
           "device": timer.device(), "ceiling_gbps": ceiling, "state_budget": budget, "workload": wl.to_json(),
           "dropped": dropped,
           "scenarios": out}
    del engine, timer
    gc.collect()
    return doc


def bench_compare(a: str | Path, b: str | Path, weights, wl: Workload, **kw) -> dict:
    """Both manifests on the same workload (one loaded at a time), the result of A with
    `compare` holding B's prices per span."""
    doc_a = bench(a, weights, wl, **kw)
    doc_b = bench(b, weights, wl, **kw)
    d = diff(load_verified(manifest_file(a)), load_verified(manifest_file(b)))
    doc_a["compare"] = compare(doc_a, doc_b, d)
    doc_a["compare"]["result"] = doc_b
    return doc_a
