"""The scheduler decides each step's rows from plain views of the running sequences: no
device, no pool. Decode rows go first, prefill chunks share what is left of the budget."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kern.generation.scheduler import Row, Running, admissions, schedule, victim


def test_decode_rows_come_first_then_prefill_chunks_in_admission_order():
    running = [Running("a", 40), Running("b", 1), Running("c", 300), Running("d", 1)]
    assert schedule(running, budget=64, chunk_max=256, decode_groups=32, mixed_groups=32) == [
        Row("b", 1), Row("d", 1), Row("a", 40), Row("c", 22)]


def test_a_chunk_is_at_most_chunk_max_tokens():
    assert schedule([Running("a", 1000)], budget=512, chunk_max=256, decode_groups=32, mixed_groups=32) == [
        Row("a", 256)]


def test_prefill_waits_when_decode_rows_fill_the_mixed_groups():
    running = [Running(str(i), 1) for i in range(4)] + [Running("p", 10)]
    rows = schedule(running, budget=256, chunk_max=256, decode_groups=8, mixed_groups=4)
    assert [r.id for r in rows] == ["0", "1", "2", "3"]


def test_more_decode_rows_than_the_decode_program_holds_go_to_the_ragged_bound():
    running = [Running(str(i), 1) for i in range(50)]
    rows = schedule(running, budget=256, chunk_max=256, decode_groups=40, mixed_groups=40)
    assert len(rows) == 40


@given(st.lists(st.integers(1, 600), max_size=40), st.integers(1, 512), st.integers(1, 256),
       st.integers(1, 64), st.integers(1, 64))
def test_the_budget_and_bounds_always_hold(pending, budget, chunk_max, decode_groups, mixed_groups):
    running = [Running(str(i), p) for i, p in enumerate(pending)]
    rows = schedule(running, budget, chunk_max, decode_groups, mixed_groups)
    assert sum(r.tokens for r in rows) <= budget
    assert all(1 <= r.tokens <= min(chunk_max, pending[int(r.id)]) for r in rows)
    assert len({r.id for r in rows}) == len(rows)
    if any(r.tokens > 1 or pending[int(r.id)] > 1 for r in rows):
        assert len(rows) <= mixed_groups
    assert len(rows) <= max(decode_groups, mixed_groups)
    # nobody decoding is skipped while budget and groups are left
    if len(rows) < decode_groups and sum(r.tokens for r in rows) < budget:
        assert {str(i) for i, p in enumerate(pending) if p == 1} <= {r.id for r in rows}


def test_admissions_fill_up_to_max_seqs():
    assert admissions(waiting=10, running=30, max_seqs=32) == 2
    assert admissions(waiting=1, running=0, max_seqs=32) == 1
    assert admissions(waiting=5, running=32, max_seqs=32) == 0


def test_the_youngest_running_request_is_the_one_preempted():
    assert victim([Running("old", 1), Running("mid", 5), Running("new", 1)]) == "new"


def test_captured_sizes_step_by_8_to_64_and_run_ahead_sizes_thin_out_past_32():
    """Decode graphs for every size a server's batch pads to; graphs of several steps (each
    costs the start-up several captures) for the sizes up to 32, then the powers of two."""
    from kern.generation.runner import ahead_buckets, buckets

    sizes = buckets(256, 8)
    assert sizes == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, *range(80, 257, 16)]
    assert ahead_buckets(sizes) == [1, 2, 4, 8, 16, 24, 32, 64, 128, 256]
    assert buckets(12, 8) == [1, 2, 4, 8, 12] and ahead_buckets(buckets(12, 8)) == [1, 2, 4, 8, 12]
