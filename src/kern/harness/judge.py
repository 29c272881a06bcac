"""kern test end to end: diff, workload, record A, noise floor, release A, then B free and
span by span, then the facts and the verdict. A and B are never loaded together."""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..manifest.verify import Verified, verify_path
from ..runtime.engine import Engine
from . import compare, workload
from .diff import Diff, diff
from .engine_io import EngineIO
from .record import Recording, StepOut, record
from .replay import SpanRun, free_run, replay
from .verdict import EndToEnd, Facts, Flip, SpanFact, Verdict, decide


class HarnessError(RuntimeError):
    """The reference itself cannot be judged against (it does not verify or load)."""


@dataclass(frozen=True, slots=True)
class Options:
    seed: int = 0
    seqs: int = 6
    decode_steps: int = 4
    max_prompt: int | None = None
    limit: float = 0.01  # KL(A||B) in nats


@dataclass
class Report:
    lines: list[str]
    verdict: Verdict
    facts: Facts | None
    seconds: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict:
        f = self.facts
        out: dict = {"verdict": self.verdict.status, "kind": self.verdict.kind, "exit": self.verdict.code,
                     "line": self.verdict.line, "facts": self.lines, "seconds": self.seconds}
        if f is not None:
            out["spans"] = [{"span": s.label, "ops": s.ops, "replays": s.replays, "identical": s.identical,
                             "deviates": s.deviates, "worst": s.worst, "first_step": s.first_step,
                             "outside_bytes": s.outside, "unreplayable": s.unreplayable} for s in f.spans]
            e = f.e2e
            out["end_to_end"] = {"rows": e.rows, "logits_identical": e.logits_identical,
                                 "tokens_identical": e.tokens_identical,
                                 "max_kl": e.max_kl if math.isfinite(e.max_kl) else "inf",
                                 "flips": [{"step": x.step, "row": x.row,
                                            "kl": x.kl if math.isfinite(x.kl) else "inf",
                                            "margin": x.margin, "rank": x.rank} for x in e.flips],
                                 "kl_over_limit_without_flip": e.kl_over_no_flip, "domain": list(e.domain),
                                 "error": e.error}
        return out


def _load(path: str | Path, who: str) -> tuple[Verified | None, str]:
    r = verify_path(path)
    if r.verified is None:
        return None, f"{path} failed verification: " + "; ".join(str(p) for p in r.problems[:5]) + (
            f" (+{len(r.problems) - 5} more)" if len(r.problems) > 5 else "")
    return r.verified, ""


# ---- facts ---------------------------------------------------------------------------------


def span_facts(d: Diff, v_a: Verified, v_b: Verified, runs: list[SpanRun], noise: list[SpanRun],
               ran: set[str]) -> tuple[SpanFact, ...]:
    noise_at = {(r.span, r.step): r for r in noise}
    by_span: dict[int, list[SpanRun]] = {}
    for r in runs:
        by_span.setdefault(r.span, []).append(r)
    out = []
    ba, bb = v_a.manifest.buffers, v_b.manifest.buffers
    for k, span in enumerate(d.spans):
        rs = by_span.get(k, [])
        why = ", ".join(span.missing) if span.missing else ""
        absent = sorted({a for r in rs for a in r.absent})
        if absent:
            why = why or f"B lacks {', '.join(absent)}"
        if not why and not rs and span.program not in ran:
            why = "the workload never runs this program"
        identical, deviates, first, worst, score, outside = True, False, None, "", -1.0, 0
        for r in rs:
            outside += r.outside
            identical &= r.outside == 0
            nz = noise_at.get((r.span, r.step))
            for name, err in r.errs.items():
                identical &= err.identical
                if name.startswith("state:"):
                    floor = 0.0
                else:
                    floor = compare.floor_of(ba[name].dtype, bb[name].dtype if name in bb else ba[name].dtype)
                ok = compare.within(err, nz.errs.get(name) if nz else None, floor)
                if not ok:
                    deviates = True
                    first = r.step if first is None else min(first, r.step)
                    s = err.rel / floor if floor and math.isfinite(err.rel) else math.inf
                    s = s if not math.isinf(s) else 1e30 + err.differ / max(err.n, 1)
                    if s > score:
                        score = s
                        if name.startswith("state:"):
                            worst = f"{name} {err.differ} of {err.n} bytes differ"
                        else:
                            worst = (f"{name} rel err {err.rel:.3g} (floor {floor:.2g}), {err.differ} of {err.n} "
                                     f"elements differ" + (f", {err.nonfinite} non-finite" if err.nonfinite else ""))
        out.append(SpanFact(span.label, span.ops, len(rs), identical and not why, deviates, worst, first,
                            outside, why))
    return tuple(out)


def end_to_end(a: list[StepOut], b: list[StepOut], limit: float, vocab: tuple[int, int],
               a_again: list[StepOut] | None) -> EndToEnd:
    domain: list[str] = []
    flips: list[Flip] = []
    logits_same = tokens_same = True
    has_logits = all(x.logits is not None for x in a) and bool(a)
    max_kl, over, rows = 0.0, 0, 0
    for i, (x, y) in enumerate(zip(a, b)):
        if y.tokens is not None:
            bad = np.flatnonzero((y.tokens < vocab[0]) | (y.tokens >= vocab[1]))
            if bad.size:
                domain.append(f"step {i} ({y.program}) tokens row {int(bad[0])} = {int(y.tokens[bad[0]])}, "
                              f"outside [{vocab[0]}, {vocab[1]})")
        if x.tokens is not None and y.tokens is not None:
            tokens_same &= x.tokens.shape == y.tokens.shape and bool(np.array_equal(x.tokens, y.tokens))
        if not has_logits:
            rows += 0 if x.tokens is None else len(x.tokens)
            continue
        if y.logits is None or y.logits.shape != x.logits.shape:
            domain.append(f"step {i} ({y.program}) logits shape "
                          f"{None if y.logits is None else list(y.logits.shape)}, A has {list(x.logits.shape)}")
            continue
        fin = np.isfinite(y.logits.astype(np.float32))
        if not fin.all():
            r = int(np.flatnonzero(~fin.all(axis=-1))[0])
            domain.append(f"step {i} ({y.program}) logits row {r} not finite")
        logits_same &= x.logits.dtype == y.logits.dtype and x.logits.tobytes() == y.logits.tobytes()
        m = compare.rows(x.logits, y.logits)
        noisy = np.zeros(len(m.kl), bool)
        if a_again is not None and a_again[i].logits is not None:
            noisy = compare.rows(x.logits, a_again[i].logits).b_top != m.a_top
        rows += len(m.kl)
        max_kl = max(max_kl, float(m.kl.max(initial=0.0)))
        for r in range(len(m.kl)):
            if noisy[r]:
                continue
            if m.a_top[r] != m.b_top[r]:
                flips.append(Flip(i, r, float(m.kl[r]), float(m.margin[r]), int(m.rank[r])))
            elif m.kl[r] > limit:
                over += 1
    return EndToEnd(rows, has_logits, logits_same and has_logits, tokens_same, max_kl, tuple(flips), over,
                    tuple(domain))


# ---- the run -------------------------------------------------------------------------------


def judge(reference: str | Path, candidate: str | Path, weights: str | Path | None, opts: Options = Options(),
          say: Callable[[str], None] = lambda s: None) -> Report:
    lines: list[str] = []
    secs: dict[str, float] = {}
    t_all = time.perf_counter()

    def fact(s: str) -> None:
        lines.append(s)
        say(s)

    v_a, why = _load(reference, "reference")
    if v_a is None:
        raise HarnessError(f"reference {why}")
    v_b, why = _load(candidate, "candidate")
    if v_b is None:
        f = Facts((), EndToEnd(0, False, False, False, 0.0, (), 0), opts.limit, refused=why)
        return Report(lines, decide(f), f, secs)
    if v_a.manifest.target != v_b.manifest.target:
        fact(f"targets: A {v_a.manifest.target.device} {v_a.manifest.target.arch or ''}, B "
             f"{v_b.manifest.target.device} {v_b.manifest.target.arch or ''}".replace("  ", " "))
    d = diff(v_a, v_b)
    for s in d.summary():
        fact(s)

    t = time.perf_counter()
    try:
        eng_a = Engine(v_a, weights)
    except Exception as exc:
        raise HarnessError(f"reference {reference} does not load: {exc}") from exc
    io_a = EngineIO(eng_a)
    secs["load_a"] = time.perf_counter() - t
    lim = io_a.limits()
    wl = workload.make(opts.seed, lim, seqs=opts.seqs, decode_steps=opts.decode_steps, max_prompt=opts.max_prompt)
    fact(wl.describe())
    rec: Recording = record(io_a, d, wl)
    secs["record_a"] = rec.seconds
    fact(f"record A: {len(wl.steps)} steps, {len(rec.records)} span records, "
         f"{rec.stored_bytes / 2**20:.1f} MiB kept, {rec.seconds:.2f} s")
    noise, secs["noise"] = replay(io_a, "a", d, rec)
    noisy = [r for r in noise if any(not e.identical for e in r.errs.values())]
    a_again = None
    if noisy:
        worst = max((e.rel for r in noisy for e in r.errs.values()), default=0.0)
        fact(f"noise floor: {len(noisy)} of {len(noise)} span replays of A differ from A (max rel err {worst:.3g}); "
             "running A free once more for its end-to-end noise")
        del io_a, eng_a
        gc.collect()
        eng_a = Engine(v_a, weights)
        io_a = EngineIO(eng_a)
        a_again, _ = free_run(io_a, wl)
    else:
        fact(f"noise floor: A replayed {len(noise)} span records against itself: bit-identical"
             if noise else "noise floor: no spans to replay")
    del io_a, eng_a
    gc.collect()

    t = time.perf_counter()
    err = ""
    runs: list[SpanRun] = []
    b_out: list[StepOut] = []
    try:
        eng_b = Engine(v_b, weights)
        io_b = EngineIO(eng_b)
        secs["load_b"] = time.perf_counter() - t
        b_out, secs["free_b"] = free_run(io_b, wl)
        runs, secs["replay_b"] = replay(io_b, "b", d, rec)
        del io_b, eng_b
    except Exception as exc:  # the candidate's failure is a finding, not a crash of the harness
        err = f"{type(exc).__name__}: {exc}"
    gc.collect()

    facts_spans = span_facts(d, v_a, v_b, runs, noise, rec.programs_run)
    shown = 0
    quiet = [s for s in facts_spans if not s.deviates and not s.unreplayable]
    for s in facts_spans:
        if s.deviates or s.unreplayable:
            if shown < 12:
                state = (f"not replayable: {s.unreplayable}" if s.unreplayable else
                         ("DEVIATES at load" if s.first_step == -1 else
                          f"DEVIATES from step {s.first_step}") + f": {s.worst}")
                fact(f"span {s.label} ({s.ops}): {state}" + (f"; {s.outside} bytes written outside A's write set"
                                                             if s.outside else ""))
            shown += 1
    if shown > 12:
        fact(f"spans: {shown - 12} more deviate or cannot be replayed")
    if quiet:
        same = sum(s.identical for s in quiet)
        fact(f"spans: {len(quiet)} within their floor ({same} bit-identical) over "
             f"{sum(s.replays for s in quiet)} replays")
    out_b = sum(s.outside for s in facts_spans)
    if out_b:
        fact(f"spans: B wrote {out_b} bytes outside A's write sets in all")

    if err:
        e2e = EndToEnd(0, False, False, False, 0.0, (), 0, (), err)
    else:
        e2e = end_to_end(rec.outputs, b_out, opts.limit, lim.vocab, a_again)
        ranks = [x.rank for x in e2e.flips]
        fact(f"end to end: {e2e.rows} rows; argmax agrees on {e2e.rows - len(e2e.flips)}"
             + (f"; {len(e2e.flips)} flips (A's margin {min(x.margin for x in e2e.flips):.3g} to "
                f"{max(x.margin for x in e2e.flips):.3g}, A's token ranked up to {max(ranks)} by B)" if ranks else "")
             + f"; max KL(A||B) {e2e.max_kl:.3g} nat; logits {'bit-identical' if e2e.logits_identical else 'differ'}")
    unfed = tuple(sorted({s.program for s in d.spans if s.program not in rec.programs_run}))
    facts = Facts(facts_spans, e2e, opts.limit, unfed)
    secs["total"] = time.perf_counter() - t_all
    fact("time: " + ", ".join(f"{k} {v:.2f} s" for k, v in secs.items()))
    return Report(lines, decide(facts), facts, secs)
