"""The verdict: pure, from facts."""

from __future__ import annotations

import math

from kern.judge.verdict import GROWABLE, MIN_DECISIVE, EndToEnd, Facts, Flip, SpanFact, decide

OK_SPAN = SpanFact("decode A[3:4) ~ B[3:4)", "linear -> linear", 4, True, False, "", None, 0, "", "decode")
NOISY_SPAN = SpanFact("decode A[3:4) ~ B[3:4)", "linear -> linear", 4, False, False, "", None, 0, "", "decode")
BAD_SPAN = SpanFact("decode A[9:10) ~ B[9:10)", "rope -> rope", 4, False, True, "d_qkv rel err 0.9", 2, 0, "",
                    "decode")
NEAR_TIE = Flip(1, 2, 0.002, 0.001, 1)  # A's margin 0.001, within the margin floor below


def e2e(**kw) -> EndToEnd:
    base = dict(rows=20, has_logits=True, logits_identical=False, tokens_identical=False, max_kl=1e-4,
                flips=(), kl_over_no_flip=0, margin_floor=0.05, decisive=(("decode", MIN_DECISIVE),))
    return EndToEnd(**{**base, **kw})


def v(spans=(OK_SPAN,), **kw):
    unfed, only_b = kw.pop("unfed", ()), kw.pop("only_b", ())
    grown, capped = kw.pop("grown", ""), kw.pop("capped", False)
    return decide(Facts(tuple(spans), e2e(**kw), 0.01, unfed, grown=grown, capped=capped, only_b=only_b))


def test_bit_identical():
    r = v(logits_identical=True, tokens_identical=True, max_kl=0.0)
    assert (r.status, r.kind, r.code) == ("PASS", "bit-identical", 0)


def test_logits_bit_identical_when_a_span_differs_inside():
    r = v([NOISY_SPAN], logits_identical=True, tokens_identical=True, max_kl=0.0)
    assert (r.status, r.kind) == ("PASS", "logits bit-identical")


def test_within_the_noise_floor_allows_near_tie_flips():
    r = v([NOISY_SPAN], flips=(NEAR_TIE,))
    assert (r.status, r.kind) == ("PASS", "within the noise floor")


def test_logit_evidence_when_a_span_deviates_but_enough_decisive_rows_agree():
    r = v([BAD_SPAN], flips=(NEAR_TIE,))
    assert (r.status, r.kind) == ("PASS", "logit evidence")


def test_deviating_span_with_too_few_decisive_rows_is_thin_evidence():
    r = v([BAD_SPAN], decisive=(("decode", MIN_DECISIVE - 1), ("prefill", 100)))
    assert (r.status, r.kind) == ("INCONCLUSIVE", "thin") and "decode A[9:10)" in r.line and r.kind in GROWABLE


def test_a_program_only_the_candidate_has_is_judged_by_its_decisive_rows():
    """A wide decode only B has (fed by a decode step wider than A's programs take) has no span
    to replay: its rows must vouch for it, as for a span that cannot be replayed."""
    ok = v([NOISY_SPAN], only_b=("decode_wide",), decisive=(("decode", 30), ("decode_wide", MIN_DECISIVE)))
    assert (ok.status, ok.kind) == ("PASS", "logit evidence") and "decode_wide only in B" in ok.line
    thin = v([NOISY_SPAN], only_b=("decode_wide",), decisive=(("decode", 30), ("decode_wide", MIN_DECISIVE - 1)))
    assert (thin.status, thin.kind) == ("INCONCLUSIVE", "thin") and f"decode_wide {MIN_DECISIVE - 1}" in thin.line


def test_flip_at_a_margin_beyond_the_noise_is_inconclusive_even_within_the_kl_limit():
    r = v([NOISY_SPAN], flips=(Flip(1, 2, 0.004, 0.3, 1),))
    assert (r.status, r.kind) == ("INCONCLUSIVE", "flips beyond noise") and r.kind in GROWABLE


def test_measured_kl_floor_raises_the_limit():
    flip = Flip(1, 2, 0.03, 0.001, 1)
    assert v([NOISY_SPAN], flips=(flip,)).status == "FAIL"
    assert v([NOISY_SPAN], flips=(flip,), kl_floor=0.05).kind == "within the noise floor"


def test_the_line_says_how_the_workload_grew_or_that_the_cap_hit():
    r = v([BAD_SPAN], grown="grown twice: +40 rows of natural-ish prompts")
    assert r.kind == "logit evidence" and r.line.endswith("(workload grown twice: +40 rows of natural-ish prompts)")
    r = v([BAD_SPAN], decisive=(), grown="grown once: +8 rows", capped=True)
    assert r.kind == "thin" and r.line.endswith("(time cap hit, workload grown once: +8 rows)")
    assert "\n" not in r.line


def test_wide_flip_fails_and_names_the_span():
    r = v([OK_SPAN, BAD_SPAN], flips=(Flip(2, 0, 0.8, 1.5, 7),), max_kl=0.8)
    assert r.status == "FAIL" and r.code == 1
    assert "failing span decode A[9:10) ~ B[9:10) (rope -> rope) at step 2" in r.line


def test_domain_fails_first():
    r = v(domain=("step 0 tokens row 1 = 99999, outside [0, 256)",), logits_identical=True, tokens_identical=True)
    assert r.status == "FAIL" and "outside its declared domain" in r.line


def test_unfed_program_is_inconclusive():
    r = v(unfed=("verify",))
    assert (r.status, r.code) == ("INCONCLUSIVE", 2) and "verify" in r.line


def test_kl_over_limit_without_flip_is_inconclusive():
    r = v(kl_over_no_flip=3, max_kl=0.05)
    assert r.status == "INCONCLUSIVE"


def test_no_logits_and_different_tokens_is_inconclusive():
    r = v(has_logits=False, max_kl=0.0)
    assert r.status == "INCONCLUSIVE"


def test_unreplayable_span_caps_the_kind_at_logit_evidence():
    s = SpanFact("decode A[1:2) ~ B[1:2)", "x -> y", 0, False, False, "", None, 0, "buffer 'q' (not in B)",
                 "decode")
    assert v([s]).kind == "logit evidence"
    r = v([s], flips=(Flip(0, 0, math.inf, 3.0, 100),))
    assert r.status == "FAIL" and "could not be replayed" in r.line


def test_refused_and_crashed_candidates_fail():
    assert decide(Facts((), e2e(), 0.01, refused="bad manifest")).status == "FAIL"
    assert decide(Facts((BAD_SPAN,), e2e(error="IndexError: x"), 0.01)).status == "FAIL"
