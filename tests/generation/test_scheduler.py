"""The scheduler decides each step's rows from plain views of the running sequences: no
device, no pool. Decode rows go first, prefill chunks share what is left of the budget."""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from kern.generation.scheduler import Row, Running, admissions, keys_of, schedule, victim


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


# Where the deployment counts the prompt keys a step attends over (a Batch.keys var: Kimi's
# expanded MLA prefill), a prompt chunk of n rows from position w of a prompt of P tokens
# attends over min(w + n, P) keys; a generated row over none.

def test_prompt_chunks_are_cut_to_the_keys_a_step_may_attend_over():
    running = [Running("a", 300, written=900, prompt_len=1200), Running("b", 500, written=100, prompt_len=600),
               Running("c", 1, written=2000, prompt_len=10)]
    # c decodes (no keys); a's chunk attends over keys 0 .. 1,199 (its prompt's end); 300 keys are left for
    # b: its chunk is cut to positions 100 .. 299 (keys 0 .. 299)
    rows = schedule(running, budget=2048, chunk_max=2048, decode_groups=8, mixed_groups=8, keys=1500)
    assert rows == [Row("c", 1), Row("a", 300), Row("b", 200)]
    # a chunk that cannot take even one row waits; a later, shorter prompt may go
    running = [Running("a", 300, written=900, prompt_len=1200), Running("b", 50, written=400, prompt_len=450),
               Running("c", 20, written=0, prompt_len=20)]
    assert schedule(running, budget=2048, chunk_max=2048, decode_groups=8, mixed_groups=8, keys=1300) == [
        Row("a", 300), Row("c", 20)]


@given(st.lists(st.tuples(st.integers(1, 600), st.integers(0, 900), st.integers(1, 1200)), min_size=1, max_size=30),
       st.integers(1, 512), st.integers(1, 256), st.integers(1200, 3000))
# four prompts each at its last token, fed as one-token rows: their keys count too (1,201 went)
@example([(1, 194, 195), (1, 300, 301), (1, 335, 336), (1, 368, 369)], 4, 1, 1200)
def test_a_step_s_prompt_keys_stay_within_the_bound(seqs, budget, chunk_max, keys):
    running = [Running(str(i), p, written=w, prompt_len=pl) for i, (p, w, pl) in enumerate(seqs)]
    rows = schedule(running, budget, chunk_max, 64, 64, keys=keys)
    by_id = {r.id: r for r in running}
    assert sum(keys_of(by_id[r.id], r.tokens) for r in rows) <= keys
    # the first prompt chunk always goes (the context is at most the bound: a prompt fits alone)
    first = next((r for r in running if r.pending > 1), None)
    if first is not None and first.prompt_len <= keys and not any(r.pending == 1 for r in running):
        assert rows and rows[0].id == first.id
