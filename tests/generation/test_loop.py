"""The loop on a tiny random model (CPU): batching never changes a sequence's tokens, memory
comes back after every workload, aborts free within a step, prefixes are reused."""

from __future__ import annotations

import numpy as np
import pytest

from kern.generation import SamplingParams
from kern.errors import BoundsError

from .conftest import make_loop

GREEDY = SamplingParams(max_tokens=12, ignore_eos=True)


def _prompts(n: int, seed: int = 0, lo: int = 1, hi: int = 40) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, rng.integers(lo, hi)).tolist() for _ in range(n)]


def _run(loop, arrivals: dict[int, list[tuple[str, list[int], SamplingParams]]]) -> dict[str, list]:
    """Step the loop, adding requests at the steps given; every request's Deltas."""
    out: dict[str, list] = {}
    step = 0
    while loop.has_work() or any(s >= step for s in arrivals):
        for rid, ids, params in arrivals.get(step, []):
            loop.add(rid, ids, params)
        for d in loop.step():
            out.setdefault(d.request_id, []).append(d)
        step += 1
    return out


def _tokens(deltas) -> list[int]:
    return [t for d in deltas for t in d.token_ids]


@pytest.fixture(scope="module")
def alone(tiny_llama):
    """Each prompt's greedy tokens, run alone in a loop of its own."""
    loop = make_loop(tiny_llama)
    return {i: _tokens(_run(loop, {0: [(f"a{i}", p, GREEDY)]})[f"a{i}"]) for i, p in enumerate(_prompts(6))}


def test_decode_rows_take_decode_slices_beside_a_prefill_chunk_where_graphs_exist(tiny_llama, alone):
    """With decode graphs (forced here on the CPU, the bound cut to 2), one-row feeds go through
    the decode program in slices of its bound and only longer chunks through the ragged one,
    in the same step, the decode slices first; the host waits for a run only where a later run
    of the step is of the same program (it would rewrite that run's inputs), so the ragged
    run's launches go while the last decode slice runs. Every sequence gets its tokens alone."""
    from kern.generation.runner import buckets

    loop = make_loop(tiny_llama, budget=24)
    runner = loop.runner
    runner.graphs, runner.decode_max, runner.sizes = True, 2, buckets(2)
    steps: list[list[tuple[str, int, bool]]] = []  # each step's (program, groups, wait) runs
    real_run, real_step = runner.engine.run, loop.step

    def run(program, vars, inputs=None, wait=True):
        steps[-1].append((program, vars.get(runner.decode.groups_var), wait))
        return real_run(program, vars, inputs, wait)

    def step():
        steps.append([])
        return real_step()

    runner.engine.run, loop.step = run, step
    try:
        got = _run(loop, {0: [(f"c{i}", p, GREEDY) for i, p in enumerate(_prompts(6))]})
    finally:
        runner.engine.run, loop.step = real_run, real_step
    assert {i: _tokens(got[f"c{i}"]) for i in range(6)} == alone
    dec, rag = runner.decode.program, runner.ragged.program
    decode = [g for s in steps for p, g, _ in s if p == dec]
    assert max(decode) <= 2  # never more rows than the decode bound in one run
    assert any(len(s) > 2 for s in steps)  # 6 decode rows: three slices in one step
    mixed = [s for s in steps if {p for p, _, _ in s} == {dec, rag}]
    assert mixed
    for s in mixed:
        assert [p for p, _, _ in s] == [dec] * (len(s) - 1) + [rag]
        assert [w for _, _, w in s] == [True] * (len(s) - 2) + [False, False]  # the reads wait


def test_batched_decode_gives_each_sequence_its_tokens_alone(tiny_llama, alone):
    loop = make_loop(tiny_llama, budget=24)  # small budget: prefill chunks mix with decode rows
    prompts = _prompts(6)
    arrivals = {0: [("b0", prompts[0], GREEDY), ("b1", prompts[1], GREEDY)],
                3: [("b2", prompts[2], GREEDY)], 4: [("b3", prompts[3], GREEDY), ("b4", prompts[4], GREEDY)],
                9: [("b5", prompts[5], GREEDY)]}
    got = _run(loop, arrivals)
    for i in range(6):
        assert _tokens(got[f"b{i}"]) == alone[i], i
        assert got[f"b{i}"][-1].finish_reason == "length" and got[f"b{i}"][-1].completion_tokens == 12


@pytest.mark.parametrize("padded", [False, True], ids=["as is", "padded like graphs"])
def test_a_decoding_batch_runs_ahead_streaming_each_step_and_gives_each_sequence_its_tokens_alone(tiny_llama, alone,
                                                                                                   padded):
    """With nobody waiting, the scheduler runs the decoding batch 4 steps a host wait (each
    step's token fed back on the device): every step's Deltas reach `emit` one step at a time,
    a row that ends inside a run keeps only its tokens, and the pool holds nothing after. Where
    graphs exist (forced here) the batch pads to a run-ahead size with scratch rows."""
    from dataclasses import replace

    from kern.generation.runner import ahead_buckets, buckets

    loop = make_loop(tiny_llama)
    loop.limits = replace(loop.limits, run_ahead=4)
    if padded:
        r = loop.runner
        r.graphs, r.sizes = True, buckets(r.decode_max, 2)
        r.ahead_sizes = ahead_buckets(r.sizes, fine=4)  # 6 rows run ahead padded to 8
    prompts = _prompts(6)
    short = SamplingParams(max_tokens=6, ignore_eos=True)  # ends inside its second run
    for i, p in enumerate(prompts):
        loop.add(f"r{i}", p, short if i == 5 else GREEDY)
    got: dict[str, list] = {}
    runs = []

    def emit(batch):  # one step of a run, as it lands
        assert len({d.request_id for d in batch}) == len(batch) and all(len(d.token_ids) == 1 for d in batch)
        runs[-1] += 1
        for d in batch:
            got.setdefault(d.request_id, []).append(d)

    while loop.has_work():
        runs.append(0)
        for d in loop.step(emit):
            got.setdefault(d.request_id, []).append(d)
    assert 4 in runs  # steps that ran ahead handed over four batches each
    for i in range(5):
        assert _tokens(got[f"r{i}"]) == alone[i], i
    assert _tokens(got["r5"]) == alone[5][:6] and got["r5"][-1].finish_reason == "length"
    loop.paging.pool.check()
    assert len(loop.paging.pool.leases) == 1  # the scratch page's


@pytest.mark.parametrize("left", [5, 6, 7, 8])
def test_a_run_ahead_never_steps_a_row_past_the_context(tiny_llama, left):
    """A request that ends at the context's last position, beside one with tokens to spare: the
    batch steps one at a time near that end (a run would step the first past the context's
    bound, which the programs refuse), and both get every token. Some of the lengths put a run's
    start 1 to 3 positions before the end."""
    from dataclasses import replace

    loop = make_loop(tiny_llama)
    loop.limits = replace(loop.limits, run_ahead=4)
    ctx = loop.context
    loop.add("edge", [5] * (ctx - left), SamplingParams(max_tokens=left, ignore_eos=True))
    loop.add("free", [6] * 20, SamplingParams(max_tokens=40, ignore_eos=True))
    got = _run(loop, {})
    assert len(_tokens(got["edge"])) == left and len(_tokens(got["free"])) == 40
    loop.paging.pool.check()


def test_a_request_past_the_context_is_refused_not_clipped(tiny_llama):
    """One policy with the server's 400: prompt + max_tokens past the context is refused in
    one line naming the room left; exactly at the context is admitted."""
    loop = make_loop(tiny_llama)
    ctx = loop.context
    with pytest.raises(BoundsError, match=f"max_tokens is 6, but the prompt's {ctx - 5} tokens leave room "
                                          f"for at most 5 in this model's context of {ctx} positions"):
        loop.add("over", [5] * (ctx - 5), SamplingParams(max_tokens=6))
    assert not loop.has_work()
    loop.add("fits", [5] * (ctx - 5), SamplingParams(max_tokens=5))


def test_a_preempted_request_resumes_from_its_checkpoint_with_the_same_tokens(tiny_llama, alone):
    loop = make_loop(tiny_llama)
    prompts = _prompts(6)
    loop.add("p0", prompts[0], GREEDY)
    loop.add("p1", prompts[1], GREEDY)
    got: dict[str, list] = {}
    for _ in range(5):
        for d in loop.step():
            got.setdefault(d.request_id, []).append(d)
    loop.preempt("p0")
    assert [s.id for s in loop.waiting] == ["p0"] and loop.paging.pool.leases.__len__() == 2  # p1 + scratch
    while loop.has_work():
        for d in loop.step():
            got.setdefault(d.request_id, []).append(d)
    assert _tokens(got["p0"]) == alone[0] and _tokens(got["p1"]) == alone[1]


def test_when_the_budget_cannot_grow_them_the_youngest_are_preempted_and_resume_with_the_same_tokens(tiny_llama):
    # one chunk (256 pages); 16 requests of up to 30 + 300 tokens (about 21 pages each), promised
    # only 16 tokens past their prompt
    loop = make_loop(tiny_llama, state_budget=1, headroom=16)
    prompts = _prompts(16, seed=4, lo=2, hi=30)
    params = SamplingParams(max_tokens=300, ignore_eos=True)
    preempted = []
    real = loop.scheduler.preempt
    loop.scheduler.preempt = lambda s: (preempted.append(s.id), real(s))
    got = _run(loop, {0: [(f"g{i}", p, params) for i, p in enumerate(prompts)]})
    assert preempted  # the pool said so
    alone = make_loop(tiny_llama, headroom=None)
    for i in sorted({int(r[1:]) for r in preempted})[:3]:
        want = _tokens(_run(alone, {0: [(f"a{i}", prompts[i], params)]})[f"a{i}"])
        assert _tokens(got[f"g{i}"]) == want, i
    assert all(len(_tokens(d)) == 300 for d in got.values())
    loop.paging.pool.check()
    assert len(loop.paging.pool.leases) == 1


def test_the_head_of_the_queue_waits_for_memory_and_is_not_overtaken(tiny_llama):
    # one chunk: 256 pages of 16 tokens of the tiny model; each lease promised its worst case
    loop = make_loop(tiny_llama, state_budget=1, headroom=None)
    big = SamplingParams(max_tokens=509, ignore_eos=True)  # 512 tokens reserved: 32 pages
    for i in range(10):
        loop.add(f"big{i}", [1, 2, 3], big)
    loop.add("small", [7], SamplingParams(max_tokens=2, ignore_eos=True))
    loop.step()
    k = len(loop.running)
    assert k == 7  # 7 x 32 pages and the scratch page: the eighth does not fit
    assert [s.id for s in loop.waiting] == [f"big{i}" for i in range(7, 10)] + ["small"]
    loop.abort("big0")
    loop.step()
    assert [s.id for s in loop.running][-1] == "big7" and loop.waiting[0].id == "big8"


def test_abort_frees_the_lease_at_once_and_reports_it_next_step(tiny_llama):
    loop = make_loop(tiny_llama)
    for i, p in enumerate(_prompts(3, seed=1)):
        loop.add(f"r{i}", p, GREEDY)
    loop.step()
    before = len(loop.paging.pool.leases)
    loop.abort("r1")
    assert len(loop.paging.pool.leases) == before - 1
    loop.abort("nobody")  # unknown: nothing happens
    deltas = loop.step()
    (ab,) = [d for d in deltas if d.request_id == "r1"]
    assert ab.finish_reason == "abort" and ab.token_ids == ()
    assert all(d.request_id != "r1" for d in loop.step())


def test_a_hundred_random_requests_leave_the_pool_at_its_baseline(tiny_llama):
    loop = make_loop(tiny_llama, budget=64, max_seqs=12, state_budget=1, headroom=8)
    pool = loop.paging.pool
    idle = pool.usage()["kv"]
    rng = np.random.default_rng(7)
    prompts = _prompts(110, seed=3, hi=120)
    pending = list(range(110))
    finished: dict[str, str] = {}
    step = 0
    while pending or loop.has_work():
        for _ in range(int(rng.integers(0, 4))):
            if pending:
                i = pending.pop(0)
                temp = float(rng.choice([0.0, 0.0, 0.8]))
                loop.add(f"q{i}", prompts[i], SamplingParams(
                    max_tokens=int(rng.integers(1, 60)), temperature=temp, seed=i, top_k=int(rng.integers(0, 5)),
                    stop_token_ids=(int(rng.integers(0, 256)),), logprobs=2 if i % 7 == 0 else None))
        if step % 5 == 0 and loop.running:
            loop.abort(loop.running[int(rng.integers(0, len(loop.running)))].id)
        for d in loop.step():
            if d.finish_reason:
                finished[d.request_id] = d.finish_reason
        step += 1
        if step % 25 == 0:
            pool.check()
    assert len(finished) == 110 and set(finished.values()) <= {"stop", "length", "abort"}
    assert "abort" in finished.values() and "length" in finished.values()
    pool.check()
    assert len(pool.leases) == 1  # the scratch page padding rows write to
    now = pool.usage()["kv"]
    assert now["reserved"] == idle["reserved"]
    pool.clear()  # checkpoints aside, everything is back
    assert pool.usage()["kv"] == idle
    assert loop.stats().running == loop.stats().waiting == 0


def test_a_repeated_prefix_is_served_from_the_cache(tiny_llama, alone):
    loop = make_loop(tiny_llama)
    prompt = _prompts(6)[3]
    first = _run(loop, {0: [("c1", prompt, GREEDY)]})["c1"]
    again = _run(loop, {0: [("c2", prompt, GREEDY)]})["c2"]
    assert first[-1].cached_tokens == 0 and again[-1].cached_tokens > 0
    assert _tokens(again) == _tokens(first) == alone[3]
    # a second turn: the first turn's prompt and answer are its history
    turn2 = prompt + _tokens(first) + [5, 6, 7]
    t2 = _run(loop, {0: [("c3", turn2, GREEDY)]})["c3"]
    assert t2[-1].cached_tokens >= len(prompt) + len(_tokens(first)) - 1 - loop.paging.page_tokens
    assert loop.stats().cached_tokens == again[-1].cached_tokens + t2[-1].cached_tokens


def test_a_parked_checkpoint_wakes_with_the_same_tokens(tiny_llama, alone):
    loop = make_loop(tiny_llama, host_bytes=4 << 20)
    prompt = _prompts(6)[2]
    _run(loop, {0: [("w1", prompt, GREEDY)]})
    pool, paging = loop.paging.pool, loop.paging
    (ckpt,) = [c for c in pool.checkpoints() if c.on_device]
    paging.execute(pool.park(ckpt))
    assert ckpt.parked and not ckpt.on_device
    loop.engine.states["kv"][:] = 0x7F  # the device copy is gone for sure: only the host copy can serve
    woke = _run(loop, {0: [("w2", prompt, GREEDY)]})["w2"]
    assert woke[-1].cached_tokens > 0 and _tokens(woke) == alone[2]
    pool.check()


BAD_REQUESTS = [
    ("empty prompt", [], GREEDY, "empty prompt"),
    ("beyond the context", [1] * 512, GREEDY, "the prompt is 512 tokens; this model's context is 512 positions"),
    ("outside the vocabulary", [1, 999], GREEDY, r"prompt token ids must be integers in \[0, 256\)"),
    ("bad params", [1], SamplingParams(top_p=2), r"top_p must be in \(0, 1\]"),
]


@pytest.mark.parametrize("what,ids,params,message", BAD_REQUESTS, ids=[b[0] for b in BAD_REQUESTS])
def test_a_request_that_can_never_run_is_refused_at_add(tiny_llama, what, ids, params, message):
    loop = make_loop(tiny_llama)
    with pytest.raises(BoundsError, match=message):
        loop.add("x", ids, params)
    assert not loop.has_work()


def test_a_duplicate_id_is_refused(tiny_llama):
    loop = make_loop(tiny_llama)
    loop.add("x", [1], GREEDY)
    with pytest.raises(BoundsError, match="request id 'x' is already in the loop"):
        loop.add("x", [1], GREEDY)
