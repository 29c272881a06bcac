"""Host sampling over a batch of logits rows: each row its own parameters and its own seeded
generator; penalties move the logits they should; logprobs are the model's own."""

from __future__ import annotations

import numpy as np
import pytest

from kern.generation import SamplingParams
from kern.generation.sampling import penalize, sample

V = 50


def _logits(rows: int = 4, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(rows, V)).astype(np.float32) * 3


def _draw(logits, params, seeds, steps=20):
    rngs = [np.random.Generator(np.random.PCG64(s)) for s in seeds]
    n = len(params)
    return [sample(logits, params, rngs, [[]] * n, [[]] * n)[0] for _ in range(steps)]


def test_the_same_seed_reproduces_and_another_seed_differs():
    z = _logits()
    p = [SamplingParams(temperature=1.0)] * 4
    assert _draw(z, p, [1, 2, 3, 4]) == _draw(z, p, [1, 2, 3, 4])
    assert _draw(z, p, [1, 2, 3, 4]) != _draw(z, p, [9, 9, 9, 9])


def test_a_row_draws_the_same_whatever_else_is_in_the_batch():
    z = _logits()
    alone = _draw(z[:1], [SamplingParams(temperature=0.9, top_p=0.8)], [5])
    batched = _draw(z, [SamplingParams(temperature=0.9, top_p=0.8), SamplingParams(temperature=2.0),
                        SamplingParams(), SamplingParams(top_k=3, temperature=1.0)], [5, 6, 7, 8])
    assert [b[0] for b in batched] == [a[0] for a in alone]


def test_top_k_one_and_temperature_zero_are_greedy():
    z = _logits()
    want = z.argmax(axis=1).tolist()
    for p in (SamplingParams(temperature=1.5, top_k=1), SamplingParams()):
        assert _draw(z, [p] * 4, [0, 1, 2, 3], steps=1)[0] == want


def test_top_k_top_p_and_min_p_keep_only_the_likely_tokens():
    z = _logits(1)[0]
    order = np.argsort(-z)
    p = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    cases = [(SamplingParams(temperature=1.0, top_k=3), set(order[:3].tolist())),
             (SamplingParams(temperature=1.0, top_p=0.5),
              set(order[:int(np.searchsorted(np.cumsum(p[order]), 0.5)) + 1].tolist())),
             (SamplingParams(temperature=1.0, min_p=0.3), set(np.flatnonzero(p >= 0.3 * p.max()).tolist()))]
    for params, allowed in cases:
        seen = {t for step in _draw(z[None], [params], [3], steps=300) for t in step}
        assert seen <= allowed and len(seen) > (1 if len(allowed) > 1 else 0), params


def test_each_penalty_moves_what_it_should():
    z = np.array([[2.0, -2.0, 1.0, 0.5]])
    out = [[0, 0, 1]]
    rep = penalize(z, [SamplingParams(repetition_penalty=2.0)], [[2]], out)[0]
    assert rep.tolist() == [1.0, -4.0, 0.5, 0.5]  # seen: 0, 1 (output) and 2 (prompt); 3 untouched
    freq = penalize(z, [SamplingParams(frequency_penalty=0.5)], [[2]], out)[0]
    assert freq.tolist() == [1.0, -2.5, 1.0, 0.5]  # per occurrence in the output only
    pres = penalize(z, [SamplingParams(presence_penalty=0.5)], [[2]], out)[0]
    assert pres.tolist() == [1.5, -2.5, 1.0, 0.5]  # once per token in the output
    assert penalize(z, [SamplingParams()], [[2]], out)[0].tolist() == z[0].tolist()


def test_a_penalty_turns_greedy_away_from_a_repeated_token():
    z = np.array([[3.0, 2.9, 0.0]], np.float32)
    tok, _ = sample(z, [SamplingParams(presence_penalty=0.5)], [np.random.Generator(np.random.PCG64(0))],
                    [[]], [[0]])
    assert tok == [1]


def test_logprobs_are_the_models_own_and_sum_to_at_most_one():
    z = _logits(2)
    params = [SamplingParams(temperature=0.7, logprobs=5), SamplingParams(logprobs=0)]
    toks, lps = sample(z, params, [np.random.Generator(np.random.PCG64(s)) for s in (1, 2)], [[], []], [[], []])
    for i, (t, lp) in enumerate(zip(toks, lps)):
        assert lp.token == t and len(lp.top) == params[i].logprobs
        ref = z[i].astype(np.float64) - np.log(np.exp(z[i].astype(np.float64)).sum())
        assert np.isclose(lp.logprob, ref[t])
        assert [k for k, _ in lp.top] == np.argsort(-ref, kind="stable")[:len(lp.top)].tolist()
        assert sum(np.exp(v) for _, v in lp.top) <= 1 + 1e-9
        assert all(a >= b for (_, a), (_, b) in zip(lp.top, lp.top[1:]))


def test_draws_follow_the_softmax_of_what_is_kept():
    """Frequencies over many seeded draws match the kept tokens' renormalized softmax."""
    from kern.generation.sampling import _draw

    z = np.array([2.0, 1.0, 0.5, 0.0, -1.0])
    p = np.exp(z) / np.exp(z).sum()
    g = np.random.Generator(np.random.PCG64(0))
    for params, want in [(SamplingParams(temperature=1.0), p),
                         (SamplingParams(temperature=1.0, top_k=2), np.r_[p[:2] / p[:2].sum(), 0, 0, 0])]:
        got = np.bincount([_draw(z, params, g) for _ in range(20000)], minlength=5) / 20000
        assert np.abs(got - want).max() < 0.02, (params, got, want)


def test_the_candidate_sort_picks_what_a_full_sort_picks(monkeypatch):
    """Truncated rows sort only the best CANDIDATES; the token is the one a full sort gives."""
    from kern.generation import sampling

    z = np.random.default_rng(3).standard_normal(5000) * 2
    cases = [SamplingParams(temperature=0.8, top_p=0.9), SamplingParams(temperature=1.0, top_k=50),
             SamplingParams(temperature=1.0, min_p=0.01), SamplingParams(temperature=1.2, top_p=0.999)]
    for params in cases:
        for seed in range(20):
            monkeypatch.setattr(sampling, "CANDIDATES", 64)
            few = sampling._draw(z / params.temperature, params, np.random.Generator(np.random.PCG64(seed)))
            monkeypatch.setattr(sampling, "CANDIDATES", z.size)
            full = sampling._draw(z / params.temperature, params, np.random.Generator(np.random.PCG64(seed)))
            assert few == full, (params, seed)


class _Top:
    """A generator whose every uniform draw is the largest double below 1."""

    def random(self):
        return float(np.nextafter(1.0, 0.0))


INF, NAN, F32_MAX = float("inf"), float("nan"), float(np.finfo(np.float32).max)
# (case, logits row, params, prompt, tokens the row may draw). Every case is drawn with 50 seeds
# and with the largest u below 1; its logprobs (top 3) must be finite numbers.
EDGES = [
    ("NaN logits never win (greedy)", [NAN, 1, 2, NAN], SamplingParams(logprobs=3), [], {2}),
    ("NaN logits never win (sampled)", [NAN, 0, 9, NAN], SamplingParams(temperature=1.0, logprobs=3), [], {1, 2}),
    ("NaN logits never win (top_p)", [NAN, 0, 9, NAN], SamplingParams(temperature=1.0, top_p=0.5), [], {2}),
    ("a +inf logit is always drawn", [0, INF, 0, 0], SamplingParams(temperature=1.0, logprobs=3), [], {1}),
    ("+inf logits tie", [INF, 0, INF, 0], SamplingParams(temperature=1.0, top_k=3), [], {0, 2}),
    ("-inf logits are never drawn, even the last", [0, 0, -INF, -INF], SamplingParams(temperature=1.0, logprobs=3),
     [], {0, 1}),
    ("float32's largest logits", [F32_MAX, -F32_MAX, F32_MAX, 0], SamplingParams(temperature=1.0, logprobs=3), [],
     {0, 2}),
    ("the smallest repetition penalty", [1, 2, 3, -1], SamplingParams(temperature=1.0, repetition_penalty=5e-324),
     [0], {0}),
    ("the largest repetition penalty", [1, 2, 3, -1], SamplingParams(temperature=1.0, repetition_penalty=1e308,
                                                                                 top_k=2), [2], {0, 1}),
    ("a subnormal temperature is greedy", [1, 2, 3, -1], SamplingParams(temperature=1e-40), [], {2}),
    ("the largest temperature", [1, 2, 3, -1], SamplingParams(temperature=1.7e308), [], {0, 1, 2, 3}),
    ("the smallest top_p", [1, 2, 3, -1], SamplingParams(temperature=1.0, top_p=5e-324), [], {2}),
    ("min_p 1 keeps the best", [1, 2, 3, -1], SamplingParams(temperature=1.0, min_p=1.0), [], {2}),
    ("top_k past the vocabulary", [1, 2, 3, -INF], SamplingParams(temperature=1.0, top_k=2**62), [], {0, 1, 2}),
    ("penalties at their bounds", [1, 2, 3, -1], SamplingParams(temperature=1.0, frequency_penalty=2.0,
                                                                presence_penalty=2.0, top_p=0.99), [], {0, 1, 2, 3}),
]


@pytest.mark.parametrize("case,row,params,prompt,allowed", EDGES, ids=[c[0] for c in EDGES])
def test_float_edge_values_draw_only_what_they_may(case, row, params, prompt, allowed):
    logits = np.array([row], np.float32)
    rngs = [np.random.Generator(np.random.PCG64(s)) for s in range(50)] + [_Top()]
    with np.errstate(over="raise", invalid="raise", divide="raise"):  # no inf - inf, 0 / 0, overflow on the way
        for rng in rngs:
            tokens, logprobs = sample(logits, [params], [rng], [prompt], [[]])
            assert tokens[0] in allowed, f"drew {tokens[0]}"
            if params.logprobs is not None:
                lp = logprobs[0]
                values = [lp.logprob, *(v for _, v in lp.top)]
                assert all(np.isfinite(values)), values  # JSON has no NaN or infinity
