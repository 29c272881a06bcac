"""The verdict: pure, from the facts kern test gathered.

Floors are measured (compare.py, precision.py): spans against A's own noise and A run in B's
precision; end to end, the KL limit is the larger of --kl-limit and 4 x the KL of A in B's
precision, and a flip is a near tie when A's top-1/top-2 margin is within 4 x how far B's
precision moved a margin on any row (`margin_floor`).

FAIL (1): the candidate refused or crashed, an output outside its declared domain, or an
argmax flip whose KL(A||B) exceeds the limit on a row where A's own noise shows no flip. The
line names the first span that deviates.
PASS (0), naming the strongest kind that holds: bit-identical (every span and every output),
logits bit-identical, within the noise floor (every span within its floor, every row's KL
within the limit, flips only at near ties), logit evidence (some span beyond its floor or not
replayable, or a program only B has fed (a wide decode), but every such program shows at least
MIN_DECISIVE rows whose margin is beyond the noise and whose argmax agrees; KL within the
limit; flips only at near ties).
INCONCLUSIVE (2): the workload never runs a changed program, no logits to weigh, or the
evidence is too thin: KL above the limit without a flip, a flip at a margin the noise cannot
explain (KL within the limit), or too few decisive rows. Thin evidence makes kern test grow
the workload until it decides or a time cap is hit (judge.py); the line says which."""

from __future__ import annotations

from dataclasses import dataclass

PASS, FAIL, INCONCLUSIVE = "PASS", "FAIL", "INCONCLUSIVE"
CODES = {PASS: 0, FAIL: 1, INCONCLUSIVE: 2}
MIN_DECISIVE = 8  # decisive rows a program must show when its spans cannot vouch for it
GROWABLE = ("kl", "flips beyond noise", "thin")  # INCONCLUSIVE kinds more rows can settle


@dataclass(frozen=True, slots=True)
class SpanFact:
    label: str
    ops: str
    replays: int
    identical: bool  # every compared byte equal in every replay
    deviates: bool  # some replay beyond its floor
    worst: str  # "d_x rel 0.98 (floor 2.4e-04)" or ""
    first_step: int | None  # the first step where it deviates
    outside: int  # bytes B wrote outside A's write set (all replays)
    unreplayable: str = ""  # why it could not be replayed
    program: str = ""


@dataclass(frozen=True, slots=True)
class Flip:
    step: int
    row: int
    kl: float
    margin: float
    rank: int


@dataclass(frozen=True, slots=True)
class EndToEnd:
    rows: int
    has_logits: bool
    logits_identical: bool
    tokens_identical: bool
    max_kl: float
    flips: tuple[Flip, ...]  # argmax disagreements (A's noise-flipped rows excluded)
    kl_over_no_flip: int  # rows whose KL exceeds the limit with the argmax kept
    domain: tuple[str, ...] = ()  # outputs outside their declared domain
    error: str = ""  # the candidate could not run the workload
    kl_floor: float = 0.0  # 4 x the largest KL(A || A in B's precision)
    margin_floor: float = 0.0  # 4 x the most B's precision moved A's top-1/top-2 margin
    decisive: tuple[tuple[str, int], ...] = ()  # per program: rows beyond margin_floor whose argmax agrees


@dataclass(frozen=True, slots=True)
class Facts:
    spans: tuple[SpanFact, ...]
    e2e: EndToEnd
    limit: float
    unfed: tuple[str, ...] = ()  # programs with spans that the workload never ran
    refused: str = ""  # the candidate is not a runnable manifest
    grown: str = ""  # how the workload grew, e.g. "grown twice, +40 rows of natural-ish prompts"
    capped: bool = False  # the time cap stopped the growth
    only_b: tuple[str, ...] = ()  # programs only B has that the workload fed: judged by their logits alone

    @property
    def kl_limit(self) -> float:
        return max(self.limit, self.e2e.kl_floor)


@dataclass(frozen=True, slots=True)
class Verdict:
    status: str
    kind: str  # the PASS kind, or the reason
    line: str

    @property
    def code(self) -> int:
        return CODES[self.status]


def _culprit(f: Facts) -> str:
    dev = [s for s in f.spans if s.deviates]
    if not dev:
        bad = [s for s in f.spans if s.unreplayable]
        return (f"; no replayed span deviates ({len(bad)} could not be replayed)" if bad
                else "; no span deviates")
    first = min(dev, key=lambda s: (s.first_step if s.first_step is not None else 1 << 30))
    more = f" (+{len(dev) - 1} more span{'s' if len(dev) > 2 else ''})" if len(dev) > 1 else ""
    at = "at load" if first.first_step == -1 else f"at step {first.first_step}"
    ops = " -> ".join("+".join(x[:6]) + (f"+... ({len(x)} calls)" if len(x) > 6 else "")
                      for x in (side.split("+") for side in first.ops.split(" -> ")))
    return f"; failing span {first.label} ({ops}) {at}: {first.worst}{more}"


def _grown(f: Facts) -> str:
    if f.capped:
        return f" (time cap hit{', workload ' + f.grown if f.grown else ''})"
    return f" (workload {f.grown})" if f.grown else ""


def decide(f: Facts) -> Verdict:
    v = _decide(f)
    return Verdict(v.status, v.kind, v.line + _grown(f)) if f.grown or f.capped else v


def _decide(f: Facts) -> Verdict:
    e = f.e2e
    if f.refused:
        return Verdict(FAIL, "refused", f"FAIL: the candidate cannot run: {f.refused}")
    if e.error:
        return Verdict(FAIL, "crashed", f"FAIL: the candidate failed on the workload: {e.error}{_culprit(f)}")
    if e.domain:
        return Verdict(FAIL, "domain", f"FAIL: output outside its declared domain: {e.domain[0]}"
                       f"{f' (+{len(e.domain) - 1} more)' if len(e.domain) > 1 else ''}{_culprit(f)}")
    limit = f.kl_limit
    wide = [x for x in e.flips if x.kl > limit]
    if wide:
        w = max(wide, key=lambda x: x.kl)
        return Verdict(FAIL, "argmax flip", f"FAIL: argmax flipped beyond the KL limit {limit:.2g} nat in "
                       f"{len(wide)} of {e.rows} rows (worst KL {w.kl:.3g} at step {w.step} row {w.row}, "
                       f"A's margin {w.margin:.3g}, A's token ranked {w.rank} by B){_culprit(f)}")
    if f.unfed:
        return Verdict(INCONCLUSIVE, "unfed", "INCONCLUSIVE: the workload never runs program"
                       f"{'s' if len(f.unfed) > 1 else ''} {', '.join(f.unfed)}, which changed")
    unrep = [s for s in f.spans if s.unreplayable]
    if all(s.identical for s in f.spans) and not unrep and e.logits_identical and e.tokens_identical:
        return Verdict(PASS, "bit-identical", f"PASS (bit-identical): {len(f.spans)} spans and {e.rows} output rows "
                       "equal to the reference byte for byte")
    if e.logits_identical and e.tokens_identical and e.has_logits:
        return Verdict(PASS, "logits bit-identical", f"PASS (logits bit-identical): {e.rows} rows of logits and "
                       f"tokens equal byte for byte; {sum(not s.identical for s in f.spans)} spans differ inside")
    if not e.has_logits:
        return Verdict(INCONCLUSIVE, "no logits", "INCONCLUSIVE: the outputs differ and there are no logits to "
                       "weigh the difference")
    if e.kl_over_no_flip:
        return Verdict(INCONCLUSIVE, "kl", f"INCONCLUSIVE: KL exceeds {limit:.2g} nat in {e.kl_over_no_flip} rows "
                       f"without an argmax flip (max KL {e.max_kl:.3g}){_culprit(f)}")
    odd = [x for x in e.flips if x.margin > e.margin_floor]
    if odd:
        w = max(odd, key=lambda x: x.margin)
        return Verdict(INCONCLUSIVE, "flips beyond noise", f"INCONCLUSIVE: the argmax flips at {len(odd)} rows whose "
                       f"margin the noise cannot explain (A's margin up to {w.margin:.3g}, noise {e.margin_floor:.2g}) "
                       f"though KL stays within {limit:.2g} nat{_culprit(f)}")
    tail = (f"max KL {e.max_kl:.2g} nat over {e.rows} rows"
            + (f", {len(e.flips)} near-tie flip{'' if len(e.flips) == 1 else 's'}" if e.flips else ""))
    if not unrep and not any(s.deviates for s in f.spans) and not f.only_b:
        return Verdict(PASS, "within the noise floor", f"PASS (within the noise floor): all {len(f.spans)} spans "
                       f"within their floor; {tail}")
    unsure = sorted({s.program for s in f.spans if s.deviates or s.unreplayable} | set(f.only_b))
    have = dict(e.decisive)
    thin = [p for p in unsure if have.get(p, 0) < MIN_DECISIVE]
    why = ", ".join(x for x in (f"{sum(s.deviates for s in f.spans)} spans beyond their floor"
                                if any(s.deviates for s in f.spans) else "",
                                f"{len(unrep)} not replayable" if unrep else "",
                                f"{', '.join(f.only_b)} only in B" if f.only_b else "") if x)
    if thin:
        return Verdict(INCONCLUSIVE, "thin", f"INCONCLUSIVE: {why} and too few decisive rows to judge by the logits "
                       f"({', '.join(f'{p} {have.get(p, 0)}' for p in thin)}; {MIN_DECISIVE} needed){_culprit(f)}")
    return Verdict(PASS, "logit evidence", f"PASS (logit evidence): {why}; argmax agrees on "
                   f"{', '.join(f'{have.get(p, 0)} decisive {p} rows' for p in unsure)}; {tail}")
