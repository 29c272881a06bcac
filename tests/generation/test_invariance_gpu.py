"""Batch invariance on sm_90a (docs/determinism.md), random SmolLM2-135M weights: a request's
tokens and logprobs against its run alone, chunked (prefill rows in other chunks), beside 7
others (the gemv decode program), with its prompt cached (its last prompt token through the
decode program, not prefill), beside 63 others (the wide decode program's gemm twins) and
preempted mid-decode beside 7 others, then resumed (its prompt and the tokens it had from its
checkpoint, the rest decoded again).

    python -m pytest -q tests/generation/test_invariance_gpu.py   (on the H200)"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from kern.generation import SamplingParams

from .test_loop import _run
from .test_loop_gpu import _model, deployment  # noqa: F401 - the module's checkpoint and sm_90a deployment

pytestmark = pytest.mark.gpu

PARAMS = SamplingParams(max_tokens=32, ignore_eos=True, logprobs=1)  # the host reads the logits' bytes


@pytest.fixture(scope="module")
def setup(deployment):  # noqa: F811
    model = _model(deployment, run_ahead=1)
    rng = np.random.default_rng(0)
    vocab = model.engine.consts["vocab"]
    prompt = rng.integers(0, vocab, 300).tolist()
    others = [rng.integers(0, vocab, int(rng.integers(20, 400))).tolist() for _ in range(63)]
    loop = model.loop
    loop.paging.pool.clear()
    alone = _bytes(_run(loop, {0: [("r", prompt, PARAMS)]})["r"])
    return loop, prompt, others, alone


def _bytes(deltas) -> tuple:
    return tuple(t for d in deltas for t in d.token_ids), tuple(x for d in deltas for x in d.logprobs)


def _again(loop, arrivals, cache: bool = False, budget: int | None = None) -> tuple:
    if not cache:
        loop.paging.pool.clear()
    base = loop.limits
    loop.limits = base if budget is None else replace(base, budget=budget)
    try:
        return _bytes(_run(loop, arrivals)["r"])
    finally:
        loop.limits = base


def _beside(prompt, others, n: int, params: SamplingParams = PARAMS) -> dict:
    arrivals = {s: [(f"o{i}", p, params) for i, p in enumerate(others[:n]) if i % 4 == s] for s in range(4)}
    arrivals.setdefault(1, []).append(("r", prompt, params))
    return arrivals


def test_a_request_chunked_by_16_gets_its_bytes_alone(setup):
    loop, prompt, _, alone = setup
    assert _again(loop, {0: [("r", prompt, PARAMS)]}, budget=16) == alone


def test_a_request_beside_7_others_gets_its_bytes_alone(setup):
    loop, prompt, others, alone = setup
    assert _again(loop, _beside(prompt, others, 7)) == alone


def test_a_request_with_its_prompt_cached_gets_its_bytes_alone(setup):
    loop, prompt, _, alone = setup
    loop.paging.pool.clear()
    _run(loop, {0: [("warm", prompt, replace(PARAMS, max_tokens=1))]})  # the whole prompt into the cache
    assert _again(loop, {0: [("r", prompt, PARAMS)]}, cache=True) == alone


def test_a_request_beside_63_others_gets_its_bytes_alone(setup):
    loop, prompt, others, alone = setup
    assert _again(loop, _beside(prompt, others, 63)) == alone


def test_a_request_preempted_and_resumed_beside_others_gets_its_bytes_alone(setup):
    loop, prompt, others, alone = setup
    loop.paging.pool.clear()
    arrivals = _beside(prompt, others, 7)
    got, step = [], 0
    while loop.has_work() or any(s >= step for s in arrivals):
        for rid, ids, params in arrivals.get(step, []):
            loop.add(rid, ids, params)
        if step == 8:  # a few tokens decoded: its lease becomes a checkpoint, it queues again
            assert any(s.id == "r" for s in loop.running), "the request runs when it is preempted"
            loop.preempt("r")
        got += [d for d in loop.step() if d.request_id == "r"]
        step += 1
    assert _bytes(got) == alone


def test_a_seeded_request_drawn_on_the_device_gets_its_tokens_alone(setup):
    """Sampling keyed by the request (its seed and token index), never by its row: the same draws
    beside 63 others (each with its own seed) and with its prompt cached as alone."""
    loop, prompt, others, _ = setup
    seeded = SamplingParams(max_tokens=32, ignore_eos=True, temperature=0.9, seed=7)
    alone = _again(loop, {0: [("r", prompt, seeded)]})
    arrivals = _beside(prompt, others, 63, seeded)
    for s, group in arrivals.items():
        arrivals[s] = [(rid, ids, seeded if rid == "r" else replace(seeded, seed=100 + i)) for i, (rid, ids, _) in
                       enumerate(group)]
    assert _again(loop, arrivals) == alone
    assert _again(loop, {0: [("r", prompt, seeded)]}, cache=True) == alone  # its prompt cached by the run alone
