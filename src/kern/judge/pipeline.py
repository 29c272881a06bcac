"""kern test of a cut pipeline (kern cut's folder) against the manifest it was cut from.

The stages run exactly the reference's calls (kern cut copies them), so there are no spans to
replay: what can go wrong is the seams (a carried activation missing or stale, a state part
in the wrong stage). The judgement is end to end: the reference's workload through the
reference and through the stages in sequence, the logits and tokens compared row by row,
and the same verdict as any candidate's."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from pathlib import Path

from ..drive import script
from ..drive.engine_io import EngineIO
from ..manifest.verify import load_verified
from ..runtime.engine import Engine
from ..cut.pipeline import Pipeline
from .facts import end_to_end
from .judge import JudgeError, Options, Report
from .workloads import limits
from .record import StepOut, stepper_for
from .replay import free_run
from .verdict import Facts, decide


def judge_pipeline(reference: str | Path, stages: str | Path, weights: str | Path | None,
                   opts: Options = Options(), say: Callable[[str], None] = lambda s: None) -> Report:
    lines: list[str] = []
    secs: dict[str, float] = {}

    def fact(s: str) -> None:
        lines.append(s)
        say(s)

    t0 = time.perf_counter()
    try:
        eng_a = Engine(load_verified(reference), weights)
    except Exception as exc:
        raise JudgeError(f"reference {reference} does not load: {exc}") from exc
    io_a = EngineIO(eng_a)
    lim = limits(io_a, opts)
    wl = script.make(opts.seed, lim, seqs=opts.seqs, decode_steps=opts.decode_steps, max_prompt=opts.max_prompt)
    fact(wl.describe())
    a_out, secs["free_a"] = free_run(io_a, wl)
    widths = io_a.table_widths()
    steppers = [stepper_for(io_a, step) for step in wl.steps]
    del io_a, eng_a
    gc.collect()

    t = time.perf_counter()
    b_out: list[StepOut] = []
    err = ""
    try:
        pipe = Pipeline(stages, weights)
        fact(f"pipeline: {len(pipe.stages)} stages")
        for step, st in zip(wl.steps, steppers):
            vars, ins = script.feed(step, st, wl.seqs, widths)
            outs = pipe.run(st.program, vars, ins)
            b_out.append(StepOut(st.program, outs.get(st.outputs.get("tokens")), outs.get(st.outputs.get("logits"))))
        del pipe
    except Exception as exc:  # the candidate's failure is a finding, not a crash of kern test
        err = f"{type(exc).__name__}: {exc}"
    secs["free_b"] = time.perf_counter() - t
    gc.collect()
    if err:
        from .verdict import EndToEnd

        e2e = EndToEnd(0, False, False, False, 0.0, (), 0, (), err)
    else:
        e2e = end_to_end(a_out, b_out, opts.limit, lim.vocab, None)
        fact(f"end to end: {e2e.rows} rows; argmax agrees on {e2e.rows - len(e2e.flips)}; max KL(A||B) "
             f"{e2e.max_kl:.3g} nat; logits {'bit-identical' if e2e.logits_identical else 'differ'}")
    facts = Facts((), e2e, opts.limit)
    secs["total"] = time.perf_counter() - t0
    fact("time: " + ", ".join(f"{k} {v:.2f} s" for k, v in secs.items()))
    return Report(lines, decide(facts), facts, secs)
