"""Speculative rounds on the mixture of experts (cpu): its manifest is the dense one made
sparse, verify program included, and its experts compute a routed row alone (a gemv a row), so
rounds give exactly plain decoding's tokens here too."""

from __future__ import annotations

import numpy as np

from kern.api import Model
from kern.generation import SamplingParams
from kern.generation.speculative import Speculate, Speculator
from tests.generation.test_speculative import Oracle


def _generate(model, prompts, params):
    """Each prompt alone (the tiny deployment decodes 4 sequences a step at most: a batch of
    several would leave a round no rows to propose with)."""
    loop = model.loop
    got: dict[str, list[int]] = {}
    for i, p in enumerate(prompts):
        loop.add(f"r{i}", p, params)
        while loop.has_work():
            for d in loop.step():
                got.setdefault(d.request_id, []).extend(d.token_ids)
    return got


def test_moe_rounds_give_the_tokens_of_plain_decoding(moe_dep, moe_ckpt):
    rng = np.random.default_rng(3)
    spans = [rng.integers(3, 200, 10).tolist() for _ in range(3)]
    prompts = [s + s + s[:3] for s in spans]  # what prompt lookup proposes from
    params = SamplingParams(max_tokens=20, ignore_eos=True)
    plain = _generate(Model(moe_dep / "manifest.json", moe_ckpt, state_budget=32 << 20), prompts, params)
    spec = Model(moe_dep / "manifest.json", moe_ckpt, state_budget=32 << 20, speculate="ngram:4")
    assert _generate(spec, prompts, params) == plain
    # proposals from plain decoding's tokens, every third one corrupted: rounds that keep all,
    # some and none of what they propose (a random model seldom repeats itself for n-gram lookup)
    spec = Model(moe_dep / "manifest.json", moe_ckpt, state_budget=32 << 20)
    spec.loop.speculator = s = Speculator(Speculate("ngram", 4), Oracle(plain, prompts))
    assert _generate(spec, prompts, params) == plain
    assert s.stats.rounds > 0 and 0 < s.stats.accepted < s.stats.proposed
