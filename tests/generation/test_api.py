"""The Python API over the loop: generate_batch gives what generate gives one by one; bad
options are one line naming the option."""

from __future__ import annotations

import pytest

import kern
from kern.api import Model
from kern.generation import SamplingParams
from kern.errors import BoundsError

from .test_loop import _prompts


def test_generate_batch_equals_generate_one_by_one(tiny_llama):
    ckpt, manifest = tiny_llama
    model = Model(manifest, ckpt)
    prompts = _prompts(5, seed=9)
    params = [SamplingParams(max_tokens=7, ignore_eos=True),
              SamplingParams(max_tokens=5, temperature=0.8, seed=3, ignore_eos=True)] * 2 + [
              SamplingParams(max_tokens=3, ignore_eos=True)]
    batch = model.generate_batch(prompts, params)
    for p, sp, g in zip(prompts, params, batch):
        one = model.generate(p, max_tokens=sp.max_tokens, temperature=sp.temperature, seed=sp.seed,
                             ignore_eos=True)
        assert g.tokens == one.tokens and g.finish_reason == one.finish_reason == "length"
        assert g.prompt_tokens == len(p) and len(g.tokens) == sp.max_tokens
    model.paging.pool.check()
    assert len(model.paging.pool.leases) == 1


@pytest.mark.parametrize("kw,message", [
    (dict(context=0), "context must be a positive integer, got 0"),
    (dict(max_seqs=-1), "max_seqs must be a positive integer, got -1"),
    (dict(state_budget="8G"), "state_budget must be a positive integer, got '8G'"),
])
def test_bad_load_options_are_refused_naming_the_option(kw, message):
    with pytest.raises(BoundsError, match=message):
        kern.load(**kw)


def test_generate_batch_refuses_mismatched_params(tiny_llama):
    ckpt, manifest = tiny_llama
    model = Model(manifest, ckpt)
    with pytest.raises(BoundsError, match="2 prompts but 1 SamplingParams"):
        model.generate_batch([[1], [2]], [SamplingParams()])
    with pytest.raises(BoundsError, match="empty prompt"):
        model.generate_batch([[1], []])
    assert not model.loop.has_work() and len(model.paging.pool.leases) == 1
