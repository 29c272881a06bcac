"""Batch invariance of the Kimi-Linear family on sm_90a (docs/determinism.md, issue 38): the
Qwen3-MoE family's checks played on this family's default build. A request's tokens and logprobs
against its run alone (batch 1: the narrow decode's gemvs and gather gemvs; prefill's wgmma twins
and its recurrence a token at a time), chunked by 16 (its prompt cut over prefill steps, the
recurrence resumed from its slot), beside 7, 15 and 63 others (the wide decode: the wgmma twins,
moe_sort's tiles shared with other rows) and with its prompt cached (its slot from the prefix
cache, the last prompt token through the decode program, not prefill). Random weights of the
`small` shape (16 experts, top 4, widths whose reductions run through every partial of the
gemv's k order).

    python -m pytest -q tests/kimi_linear/test_invariance_gpu.py   (on the H200)"""

from __future__ import annotations

import pytest

# the checks themselves, collected here on this module's `setup`
from tests.qwen3_moe.test_invariance_gpu import (  # noqa: F401
    random_setup, test_a_request_beside_others_gets_its_bytes_alone, test_a_request_chunked_by_16_gets_its_bytes_alone,
    test_a_request_with_its_prompt_cached_gets_its_bytes_alone)

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return random_setup("kimi_linear", tmp_path_factory.mktemp("kimi_invariance"))
