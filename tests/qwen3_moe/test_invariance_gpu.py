"""Batch invariance of the Qwen3-MoE family on sm_90a (docs/determinism.md, issue 37): a request's
tokens and logprobs against its run alone (batch 1: the narrow decode's gather gemvs, prefill's
wgmma tiles), chunked by 16, beside 7 others (the narrow decode: other rows share its experts),
beside 15 and 63 others (the wide decode's wgmma tiles over moe_sort's groups) and with its prompt
cached (its last prompt token through the decode program, not prefill). Random weights of the
`small` shape (16 experts, top 4): every expert is shared by many rows at 64.

    python -m pytest -q tests/qwen3_moe/test_invariance_gpu.py   (on the H200; ~1 minute)"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from kern.generation import SamplingParams
from tests.generation.test_invariance_gpu import _again, _beside, _bytes  # the llama family's checks, shared
from tests.generation.test_loop import _run

pytestmark = pytest.mark.gpu

PARAMS = SamplingParams(max_tokens=24, ignore_eos=True, logprobs=1)  # the host reads the logits' bytes


def random_setup(family: str, tmp) -> tuple:
    """A family's `small` random checkpoint on its default sm_90a build: the loop, the request's
    prompt (200 tokens), 63 others' and the request's bytes alone (Kimi-Linear's tests play these
    checks too)."""
    from importlib import import_module

    from kern.api import Model

    ckpt = import_module(f"kern_models.{family}.random_checkpoint").make("small", tmp / "ckpt", max_positions=1024)
    man = import_module(f"kern_models.{family}.generator").generate(
        json.loads((ckpt / "config.json").read_text()), tmp / "deploy", target="cuda", context=1024)
    model = Model(man, ckpt, state_budget=1 << 30, run_ahead=1)
    rng = np.random.default_rng(0)
    vocab = model.engine.consts["vocab"]
    prompt = rng.integers(0, vocab, 200).tolist()
    others = [rng.integers(0, vocab, int(rng.integers(20, 300))).tolist() for _ in range(63)]
    loop = model.loop
    loop.paging.pool.clear()
    alone = _bytes(_run(loop, {0: [("r", prompt, PARAMS)]})["r"])
    assert len(alone[0]) == PARAMS.max_tokens
    return loop, prompt, others, alone


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return random_setup("qwen3_moe", tmp_path_factory.mktemp("moe_invariance"))


def test_a_request_chunked_by_16_gets_its_bytes_alone(setup):
    loop, prompt, _, alone = setup
    assert _again(loop, {0: [("r", prompt, PARAMS)]}, budget=16) == alone


@pytest.mark.parametrize("n", [7, 15, 63])
def test_a_request_beside_others_gets_its_bytes_alone(setup, n):
    loop, prompt, others, alone = setup
    assert _again(loop, _beside(prompt, others, n, PARAMS)) == alone


def test_a_request_with_its_prompt_cached_gets_its_bytes_alone(setup):
    loop, prompt, _, alone = setup
    loop.paging.pool.clear()
    _run(loop, {0: [("warm", prompt, replace(PARAMS, max_tokens=1))]})  # the whole prompt into the cache
    assert _again(loop, {0: [("r", prompt, PARAMS)]}, cache=True) == alone
