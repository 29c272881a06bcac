"""The loop's limits: the context is the deployment's bound unless the state budget cannot
hold one sequence that long, and then it says so in one line."""

from __future__ import annotations

import pytest

from kern.generation.limits import held_tokens, limits_for
from kern.manifest.protocol import ServingProtocol, Stepper
from kern.errors import BoundsError


def _protocol(context: int) -> ServingProtocol:
    decode = Stepper("d", "seqs", 32, 1, None, 32, {}, {}, ())
    ragged = Stepper("p", "seqs", 32, None, "tokens", 256, {}, {}, ())
    return ServingProtocol((ragged, decode), (), {"kv": 16}, context)


@pytest.mark.parametrize("held,asked,want", [(10_000, None, 4096), (10_000, 2048, 2048), (1000, None, 992)])
def test_the_context_is_the_bound_or_what_memory_holds(held, asked, want):
    lim = limits_for(_protocol(4096), lambda n: n <= held, 16, asked, None, 1)
    assert lim.context == want and lim.max_seqs == 32 and lim.budget == 256
    assert (lim.note is not None) == (want < (asked or 4096))
    if lim.note:
        assert lim.note.startswith(f"context clipped to {want} positions") and "--memory" in lim.note


@pytest.mark.parametrize("capacity,want", [(None, 32), (1 << 20, 32), (4096, 8), (100, 1)])
def test_sequences_follow_the_budget_up_to_the_bound(capacity, want):
    """A sequence is counted at SEQ_TOKENS (512) tokens of the budget: no more sequences than it
    holds, none past the programs' bound, and one at least."""
    assert limits_for(_protocol(4096), lambda n: True, 16, None, None, 1, capacity=capacity).max_seqs == want


def test_the_scratch_page_counts_against_memory():
    assert limits_for(_protocol(4096), lambda n: n <= 1024, 16, None, None, 1, scratch_tokens=16).context == 1008


def test_bad_limits_are_refused():
    with pytest.raises(BoundsError, match="max_seqs 64 is above the manifest's bound of 32"):
        limits_for(_protocol(4096), lambda n: True, 16, None, 64, 1)
    with pytest.raises(BoundsError, match="the state budget holds no sequence"):
        limits_for(_protocol(4096), lambda n: False, 16, None, None, 1)


def test_held_tokens_bisects_to_the_largest_page_multiple():
    assert held_tokens(lambda n: n <= 1000, 16, 4096) == 992
    assert held_tokens(lambda n: True, 16, 4096) == 4096


def test_a_deployment_that_counts_prompt_keys_serves_a_context_of_at_most_its_bound():
    """A prompt of the whole context must fit one step's keys (Batch.keys), so the context is at
    most the ragged program's keys bound, and the scheduler gets that bound."""
    decode = Stepper("d", "seqs", 32, 1, None, 32, {}, {}, ())
    ragged = Stepper("p", "seqs", 32, None, "tokens", 256, {}, {}, (), keys_var="keys", keys_max=3000)
    lim = limits_for(ServingProtocol((ragged, decode), (), {"kv": 16}, 4096), lambda n: True, 16, None, None, 1)
    assert lim.context == 2992 and lim.keys == 3000 and lim.note is None  # a whole page's positions
    assert limits_for(_protocol(4096), lambda n: True, 16, None, None, 1).keys is None
