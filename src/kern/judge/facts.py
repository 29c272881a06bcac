"""The facts under the verdict, pure: each span against its measured floors, and the rows of
logits against A's own (with A's noise and A in B's precision beside them)."""

from __future__ import annotations

import math

import numpy as np

from . import compare
from .diff import Diff
from .record import StepOut
from .replay import SpanRun
from .verdict import EndToEnd, Flip, SpanFact


def span_facts(d: Diff, runs: list[SpanRun], noise: list[SpanRun], sim: list[SpanRun],
               ran: set[str]) -> tuple[SpanFact, ...]:
    noise_at = {(r.span, r.step): r for r in noise}
    sim_at = {(r.span, r.step): r for r in sim}
    by_span: dict[int, list[SpanRun]] = {}
    for r in runs:
        by_span.setdefault(r.span, []).append(r)
    out = []
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
            nz, sm = noise_at.get((r.span, r.step)), sim_at.get((r.span, r.step))
            for name, err in r.errs.items():
                identical &= err.identical
                # state bytes are exact but for A's own noise: rounded inputs rewrite every byte
                sim_err = sm.errs.get(name) if sm and not name.startswith("state:") else None
                floors = (nz.errs.get(name) if nz else None, sim_err)
                if compare.within(err, *floors):
                    continue
                deviates = True
                first = r.step if first is None else min(first, r.step)
                fl = compare.floor(*floors)
                s = err.rel / fl if fl and math.isfinite(err.rel) else math.inf
                s = s if not math.isinf(s) else 1e30 + err.differ / max(err.n, 1)
                if s > score:
                    score = s
                    if name.startswith("state:"):
                        worst = f"{name} {err.differ} of {err.n} bytes differ"
                    elif math.isfinite(err.rel) and err.rel > 0:
                        worst = (f"{name} rel err {err.rel:.3g} (floor {fl:.2g}), {err.differ} of {err.n} "
                                 f"elements differ" + (f", {err.nonfinite} non-finite" if err.nonfinite else ""))
                    else:
                        worst = f"{name} {err.differ} of {err.n} elements differ" + (
                            f", {err.nonfinite} non-finite" if err.nonfinite else "")
        out.append(SpanFact(span.label, span.ops, len(rs), identical and not why, deviates, worst, first,
                            outside, why, span.program))
    return tuple(out)


def end_to_end(a: list[StepOut], b: list[StepOut], limit: float, vocab: tuple[int, int],
               a_again: list[StepOut] | None, a_sim: list[StepOut] | None = None) -> EndToEnd:
    """Row by row: B against A, A's own noise (a_again) and A in B's precision (a_sim) beside."""
    domain: list[str] = []
    logits_same = tokens_same = True
    has_logits = all(x.logits is not None for x in a) and bool(a)
    rows = 0
    per: list[tuple[int, str, compare.Rows, np.ndarray]] = []  # step, B's program, rows, A-noisy mask
    kl_floor = margin_floor = 0.0
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
        if a_sim is not None and a_sim[i].logits is not None:
            s = compare.rows(x.logits, a_sim[i].logits)
            kl_floor = max(kl_floor, float(s.kl.max(initial=0.0)))
            margin_floor = max(margin_floor, float(np.abs(s.moved).max(initial=0.0)))
        rows += len(m.kl)
        per.append((i, y.program, m, noisy))  # B's program: a wide decode only B has
    kl_floor *= compare.E2E_FACTOR
    margin_floor *= compare.E2E_FACTOR
    lim = max(limit, kl_floor)
    flips: list[Flip] = []
    max_kl, over = 0.0, 0
    decisive: dict[str, int] = {}
    for i, program, m, noisy in per:
        max_kl = max(max_kl, float(m.kl.max(initial=0.0)))
        for r in range(len(m.kl)):
            if noisy[r]:
                continue
            if m.a_top[r] != m.b_top[r]:
                flips.append(Flip(i, r, float(m.kl[r]), float(m.margin[r]), int(m.rank[r])))
            else:
                over += int(m.kl[r] > lim)
                decisive[program] = decisive.get(program, 0) + int(m.margin[r] > margin_floor)
    return EndToEnd(rows, has_logits, logits_same and has_logits, tokens_same, max_kl, tuple(flips), over,
                    tuple(domain), "", kl_floor, margin_floor, tuple(sorted(decisive.items())))
