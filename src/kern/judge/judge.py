"""kern test end to end: diff, workload, record A, its floors (A's own noise, A in B's
precision), release A, then B free and span by span, then the facts and the verdict; while the
end-to-end evidence is too thin, more rounds of a grown workload (A free, release, B free)
until it decides or the time cap is hit. A and B are never loaded together."""

from __future__ import annotations

import dataclasses
import gc
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..drive import script
from ..drive.engine_io import EngineIO
from ..errors import KernError
from ..manifest.verify import Verified, verify_path
from ..runtime.engine import Engine
from . import blas, corpus, forked, precision, workloads
from . import candidate as candidate_mod
from .diff import diff
from .facts import end_to_end, span_facts
from .invariance import Invariance
from .record import Live, Recording, StepOut, record
from .replay import SpanRun, floors_where_b_departs, free_run, replay
from .verdict import GROWABLE, EndToEnd, Facts, Verdict, decide


class JudgeError(KernError, RuntimeError):
    """The reference itself cannot be judged against (it does not verify or load)."""


@dataclass(frozen=True, slots=True)
class Options:
    seed: int = 0
    # half the sequences natural-ish text (when there is a tokenizer): ten decode rows each give
    # 22-32 decisive decode rows at once on SmolLM2-135M (seeds 0-5; 8 needed); decode rows
    # cost a cpu reference little beside prefill rows
    seqs: int = 6
    decode_steps: int = 10
    max_prompt: int | None = None
    limit: float = 0.01  # KL(A||B) in nats (the measured floor may raise it)
    time_cap: float = 60.0  # seconds: no round of a grown workload starts that would end past it
    # rows of one prefill step (the program's bound when smaller): chunked prefill is fed at a
    # fraction of the cost of a 2,048-row bound on a cpu reference
    chunk: int = 64


@dataclass
class Report:
    lines: list[str]
    verdict: Verdict
    facts: Facts | None
    seconds: dict[str, float] = field(default_factory=dict)
    alone: list[Invariance] = field(default_factory=list)  # B's batch invariance, a workload each

    def to_json(self) -> dict:
        f = self.facts
        out: dict = {"verdict": self.verdict.status, "kind": self.verdict.kind, "exit": self.verdict.code,
                     "line": self.verdict.line, "facts": self.lines, "seconds": self.seconds,
                     "batch_invariance": [x.to_json() for x in self.alone]}
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
                                 "error": e.error, "kl_limit": f.kl_limit, "margin_floor": e.margin_floor,
                                 "decisive": dict(e.decisive)}
            out["grown"], out["time_cap_hit"] = f.grown, f.capped
        return out


def _load(path: str | Path, who: str) -> tuple[Verified | None, str]:
    r = verify_path(path)
    if r.verified is None:
        return None, f"{path} failed verification: " + "; ".join(str(p) for p in r.problems[:5]) + (
            f" (+{len(r.problems) - 5} more)" if len(r.problems) > 5 else "")
    return r.verified, ""


# ---- the run -------------------------------------------------------------------------------


@dataclass
class Rows:
    """The end-to-end outputs of every round, in order: A, B, A again (when A is noisy), A in
    B's precision."""

    a: list[StepOut] = field(default_factory=list)
    b: list[StepOut] = field(default_factory=list)
    a_again: list[StepOut] | None = None
    a_sim: list[StepOut] = field(default_factory=list)


def _floors(io_a: EngineIO, prec: precision.Precision, wl: script.Workload, seed: int) -> list[StepOut]:
    """A free in B's precision, its once programs first (their tables in B's precision too)."""
    rng = np.random.Generator(np.random.PCG64(seed))
    for p in io_a.e.protocol.once:
        precision.run_rounded(io_a, prec, p, 0, len(io_a.e.m.programs[p].calls), io_a.e.env(p, {}), rng)
    return free_run(io_a, wl, prec, rng)[0]


def _round(v_a: Verified, v_b: Verified, weights, prec: precision.Precision, wl: script.Workload, seed: int,
           rows: Rows, fork: bool) -> str:
    """One more round of end-to-end rows: A free (and again when noisy, and in B's precision,
    forked beside the rest for a cpu reference), A released, B free. Returns the candidate's
    failure, or ''."""
    io = EngineIO(Engine(v_a, weights))
    # in sequence, after A's free run: the floors round the tables A's once programs wrote
    sim = forked.Part(lambda: _floors(io, prec, wl, seed), True) if fork else None
    rows.a += free_run(io, wl)[0]
    sim = sim or forked.Part(lambda: _floors(io, prec, wl, seed), False)
    del io
    gc.collect()
    if rows.a_again is not None:  # A is noisy: its own flips are excused
        io = EngineIO(Engine(v_a, weights))
        rows.a_again += free_run(io, wl)[0]
        del io
        gc.collect()
    err = ""
    try:
        io = EngineIO(Engine(v_b, weights))
        rows.b += free_run(io, wl)[0]
        del io
    except Exception as exc:  # the candidate's failure is a finding, not a crash of kern test
        err = f"{type(exc).__name__}: {exc}"
    finally:
        gc.collect()
    rows.a_sim += sim.result()
    return err


def judge(reference: str | Path, candidate: str | Path, weights: str | Path | None, opts: Options = Options(),
          say: Callable[[str], None] = lambda s: None) -> Report:
    t_all = time.perf_counter()
    v_a, why = _load(reference, "reference")
    if v_a is None:
        raise JudgeError(f"reference {why}")
    # BLAS on one thread: OpenBLAS splits a product's rows over its threads by their count, so
    # a cpu side's numbers would depend on the machine's cores (blas.py); a cpu reference's
    # pieces run in forked processes instead (forked.py)
    fork = v_a.manifest.target.device == "cpu" and forked.worth_it()
    with blas.threads(1):
        return _judge(v_a, reference, candidate, weights, opts, say, fork, t_all)


def _judge(v_a: Verified, reference: str | Path, candidate: str | Path, weights: str | Path | None, opts: Options,
           say: Callable[[str], None], fork: bool, t_all: float) -> Report:
    lines: list[str] = []
    secs: dict[str, float] = {}

    def fact(s: str) -> None:
        lines.append(s)
        say(s)

    v_b, why = _load(candidate, "candidate")
    if v_b is None:
        f = Facts((), EndToEnd(0, False, False, False, 0.0, (), 0), opts.limit, refused=why)
        return Report(lines, decide(f), f, secs)
    feed = forked.Feed() if fork else None
    # a candidate on another device loads in its own process from the start, beside A's load
    remote = candidate_mod.Beside(candidate, weights, feed) if feed and candidate_mod.apart(v_a, v_b) else None
    try:
        return _judge_loaded(v_a, v_b, reference, candidate, weights, opts, fact, lines, secs, feed, remote, t_all)
    except BaseException:
        if feed is not None:
            feed.abort()
        if remote is not None:
            remote.abandon()
        raise


def _judge_loaded(v_a: Verified, v_b: Verified, reference: str | Path, candidate: str | Path,
                  weights: str | Path | None, opts: Options, fact: Callable[[str], None], lines: list[str],
                  secs: dict[str, float], feed: forked.Feed | None, remote: candidate_mod.Beside | None,
                  t_all: float) -> Report:
    fork = feed is not None
    if v_a.manifest.target != v_b.manifest.target:
        fact(f"targets: A {v_a.manifest.target.device} {v_a.manifest.target.arch or ''}, B "
             f"{v_b.manifest.target.device} {v_b.manifest.target.arch or ''}".replace("  ", " "))
    d = diff(v_a, v_b)
    for s in d.summary():
        fact(s)
    prec = precision.of(v_a, v_b)
    coarser = sorted({f"{n} {dt}" for n, dt in prec.dtypes.items() if dt != v_a.manifest.buffers[n].dtype})
    if coarser or prec.carried:
        fact(f"precision: {len(coarser)} buffers in another dtype in B"
             + (f" ({', '.join(coarser[:4])}{', ...' if len(coarser) > 4 else ''})" if coarser else "")
             + (f"; state{'s' if len(prec.carried) > 1 else ''} {', '.join(sorted(prec.carried))} declared "
                "differently: carried by each side's replays, not compared byte for byte" if prec.carried else ""))

    text = corpus.tokens(weights) if weights is not None else None
    t = time.perf_counter()
    try:
        eng_a = Engine(v_a, weights)
    except Exception as exc:
        raise JudgeError(f"reference {reference} does not load: {exc}") from exc
    io_a = EngineIO(eng_a)
    secs["load_a"] = time.perf_counter() - t
    lim = workloads.limits(io_a, opts, v_b)
    wl = script.make(opts.seed, lim, seqs=opts.seqs, decode_steps=opts.decode_steps, max_prompt=opts.max_prompt,
                       corpus=text, mixed=True)
    fact(wl.describe())
    wide = workloads.wide(v_a, v_b, lim, opts, text)
    if wide is not None:
        fact("wide: " + wide.describe().removeprefix("workload: ") + ", run free on both sides: a decode step "
             "wider than A's decode programs take")
    # forked: the pieces run beside the record, each other and B (forked.py), the replays
    # taking the record as it is made

    def e2e_floor() -> tuple[list[StepOut], float]:
        t = time.perf_counter()
        return _floors(io_a, prec, wl, opts.seed + 1), time.perf_counter() - t

    def wide_free() -> tuple[list[StepOut], float]:
        return free_run(io_a, wide) if wide is not None else ([], 0.0)

    def wide_floor() -> tuple[list[StepOut], float]:
        t = time.perf_counter()
        return (_floors(io_a, prec, wide, opts.seed + 2) if wide is not None else []), time.perf_counter() - t

    def noise_of(r: Live) -> tuple[list[SpanRun], float]:  # forked: every record, as it is made
        return replay(io_a, "a", d, r, prec)

    def floor_of(r: Live) -> tuple[list[SpanRun], float]:
        return replay(io_a, "a", d, r, prec, np.random.Generator(np.random.PCG64(opts.seed)))

    if feed is not None:
        floors_e2e = forked.Part(e2e_floor, True)
        wide_parts = (forked.Part(wide_free, wide is not None), forked.Part(wide_floor, wide is not None))
        noise_part = forked.Part(lambda msgs: noise_of(Live(msgs)), True, feed)
        sim_part = forked.Part(lambda msgs: floor_of(Live(msgs)), True, feed)
        feed.start()
        if remote is not None:  # B, loaded beside A's load, runs beside A's record
            remote.send_setup(feed, d, prec, wl, wide)
    try:
        rec: Recording = record(io_a, d, wl, prec.carried, feed.send if feed is not None else None)
    finally:
        if feed is not None:
            feed.close()
    secs["record_a"] = rec.seconds
    fact(f"record A: {len(wl.steps)} steps, {len(rec.records)} span records, "
         f"{rec.stored_bytes / 2**20:.1f} MiB kept, {rec.seconds:.2f} s")
    if feed is None:  # in sequence; the floors last: they round the tables A's once programs wrote
        wide_parts, floors_e2e = (forked.Part(wide_free, False),), forked.Part(e2e_floor, False)
        wide_parts += (forked.Part(wide_floor, False),)
    del io_a, eng_a
    gc.collect()

    t = time.perf_counter()
    b = remote.result() if remote is not None else candidate_mod.run(v_b, weights, d, prec, wl, wide, rec)
    gc.collect()
    secs.update(b.seconds)
    if remote is not None:
        secs["wait_b"] = time.perf_counter() - t
    err, runs = b.error, b.runs
    t = time.perf_counter()
    if feed is None:  # span floors where B departs from A's record, on A loaded again (B released)
        noise, sim, secs["noise"], secs["floor"], floored = floors_where_b_departs(
            lambda: EngineIO(Engine(v_a, weights)), d, rec, prec, runs, opts.seed)
    else:
        (noise, secs["noise"]), (sim, secs["floor"]), floored = noise_part.result(), sim_part.result(), -1
    a_sim, secs["floor_e2e"] = floors_e2e.result()
    (wide_a, secs["wide_a"]), (wide_sim, secs["wide_floor"]) = wide_parts[0].result(), wide_parts[1].result()
    if wide is None:
        del secs["wide_a"], secs["wide_floor"]
    rows = Rows(a=list(rec.outputs) + wide_a, b=b.out + b.wide_out, a_sim=a_sim + wide_sim)
    only_b = tuple(sorted({x.program for x in b.wide_out} - set(v_a.manifest.programs)))
    if fork:
        secs["wait_a"] = time.perf_counter() - t
    noisy = [r for r in noise if any(not e.identical for e in r.errs.values())]
    if noisy:
        worst = max((e.rel for r in noisy for e in r.errs.values()), default=0.0)
        fact(f"noise floor: {len(noisy)} of {len(noise)} span replays of A differ from A (max rel err {worst:.3g}); "
             "running A free once more for its end-to-end noise")
        io_a = EngineIO(Engine(v_a, weights))
        rows.a_again = free_run(io_a, wl)[0] + (free_run(io_a, wide)[0] if wide is not None else [])
        del io_a
        gc.collect()
    else:
        fact(f"noise floor: A replayed {len(noise)} span records against itself: bit-identical" if noise else
             f"noise floor: not needed: B's replays of all {len(rec.records)} span records are A's bytes"
             if floored == 0 and rec.records else "noise floor: no spans to replay")

    facts_spans = span_facts(d, runs, noise, sim, rec.programs_run)
    _say_spans(facts_spans, fact)
    unfed = tuple(sorted({s.program for s in d.spans if s.program not in rec.programs_run}))
    e2e = _e2e(rows, err, opts, lim)
    facts = Facts(facts_spans, e2e, opts.limit, unfed, only_b=only_b)
    _say_e2e(facts, fact)
    for inv in b.alone:  # a fact, not the verdict: a batch-dependent B can still compute right
        fact(inv.line(str(candidate)))
    rounds, grown_rows = 0, 0
    # a round runs twice the sequences of the one before: expect twice its time (round 1's
    # end-to-end part: A recorded and run in B's precision, B loaded and run)
    last = sum(secs.get(k, 0.0) for k in ("load_a", "record_a", "floor_e2e", "load_b", "free_b"))
    while not err and decide(facts).kind in GROWABLE:
        if time.perf_counter() - t_all + 2 * last > opts.time_cap:
            facts = dataclasses.replace(facts, capped=True)
            break
        rounds += 1
        t = time.perf_counter()
        more = workloads.grow(opts, lim, rounds, text)
        fact(f"round {rounds + 1}: " + more.describe().removeprefix("workload: "))
        before = len(rows.a)
        err = _round(v_a, v_b, weights, prec, more, opts.seed + 2 * rounds + 1, rows, fork)
        grown_opts = dataclasses.replace(opts, seed=opts.seed + 1000 * rounds)
        wider = workloads.wide(v_a, v_b, lim, grown_opts, text) if wide else None
        if wider is not None and not err:  # B's wide decode may be what wants more rows
            err = _round(v_a, v_b, weights, prec, wider, opts.seed + 2 * rounds + 2, rows, fork)
        grown_rows += sum(0 if x.logits is None else len(x.logits) for x in rows.a[before:])
        secs[f"round_{rounds + 1}"] = last = time.perf_counter() - t
        e2e = _e2e(rows, err, opts, lim)
        nat = " of natural-ish prompts" if more.natural else ""
        facts = dataclasses.replace(facts, e2e=e2e, grown=f"grown {_times(rounds)}: +{grown_rows} rows{nat}")
        _say_e2e(facts, fact)
    secs["total"] = time.perf_counter() - t_all
    fact("time: " + ", ".join(f"{k} {v:.2f} s" for k, v in secs.items()))
    return Report(lines, decide(facts), facts, secs, b.alone)


def _times(n: int) -> str:
    return {1: "once", 2: "twice"}.get(n, f"{n} times")


def _e2e(rows: Rows, err: str, opts: Options, lim: script.Bounds) -> EndToEnd:
    if err:
        return EndToEnd(0, False, False, False, 0.0, (), 0, (), err)
    return end_to_end(rows.a, rows.b, opts.limit, lim.vocab, rows.a_again, rows.a_sim)


def _say_spans(facts_spans, fact: Callable[[str], None]) -> None:
    shown = 0
    quiet = [s for s in facts_spans if not s.deviates and not s.unreplayable]
    for s in facts_spans:
        if s.deviates or s.unreplayable:
            if shown < 12:
                state = (f"not replayable: {s.unreplayable}" if s.unreplayable else
                         ("DEVIATES at load" if s.first_step == -1 else
                          f"DEVIATES from step {s.first_step}") + f": {s.worst}")
                fact(f"span {s.label} ({_short(s.ops)}): {state}" + (f"; {s.outside} bytes written outside A's write set"
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


def _short(ops: str, most: int = 6) -> str:
    """A long span's ops, its first few each side."""
    sides = [x.split("+") for x in ops.split(" -> ")]
    return " -> ".join("+".join(x[:most]) + (f"+... ({len(x)} calls)" if len(x) > most else "") for x in sides)


def _say_e2e(f: Facts, fact: Callable[[str], None]) -> None:
    e = f.e2e
    if e.error:
        return
    ranks = [x.rank for x in e.flips]
    fact(f"end to end: {e.rows} rows; argmax agrees on {e.rows - len(e.flips)}"
         + (f"; {len(e.flips)} flips (A's margin {min(x.margin for x in e.flips):.3g} to "
            f"{max(x.margin for x in e.flips):.3g}, A's token ranked up to {max(ranks)} by B)" if ranks else "")
         + f"; max KL(A||B) {e.max_kl:.3g} nat (limit {f.kl_limit:.2g}); margins beyond noise "
           f"({e.margin_floor:.2g}) on " + (", ".join(f"{n} {p}" for p, n in e.decisive) or "no")
         + f" rows; logits {'bit-identical' if e.logits_identical else 'differ'}")
