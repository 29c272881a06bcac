"""Batch invariance on the hybrid (docs/determinism.md): a request's bytes on the Kimi-Linear
cpu deployment are a function of the request alone. The property test of the llama family
(tests/generation/test_invariance.py) played on the tiny random Kimi-Linear: random company,
arrival, cached prefix (a checkpoint carries the KDA slot; a shared head leaves a snapshot),
token budget (a prompt cut anywhere, a recurrence resumed mid-prompt), preemption with or
without parking in host memory, run-ahead. Beside it the kernels' own promises: a token's
recurrence, its MLA attention and its MoE routing are the same bits in a prompt chunk of any
size and in a decode batch of any size."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kern.api import Model
from tests.generation import test_invariance as llama

from .test_host_loop import prompt


@pytest.fixture(scope="module")
def kimi(kimi_dep, kimi_ckpt):
    model = Model(kimi_dep / "manifest.json", kimi_ckpt, host_bytes=64 << 20)
    return model, [prompt(3, 70), prompt(4, 45)], {}


@st.composite
def scenarios(draw):
    return {**draw(llama.scenarios()), "park": draw(st.booleans())}


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(sc=scenarios())
def test_a_request_gets_its_bytes_alone_whatever_its_batch_cache_chunking_and_preemption(kimi, sc):
    got, want = llama.played(kimi, sc)
    assert got == want
