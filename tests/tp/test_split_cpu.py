"""Tensor parallelism end to end on the cpu: the ranks of a split deployment run as threads of
one process (the peer all-reduce's barrier and peer reads in numpy), against the single-device
manifest of the same checkpoint: teacher-forced logits (KL, argmax), greedy tokens, batches."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.runtime.conftest import tiny_checkpoint
from kern.drive.parity import compare, teacher_forced

pytest.importorskip("torch")


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def pair(request, tmp_path_factory):
    from kern.api import Model
    from kern_models.llama.generator import generate

    tmp = tmp_path_factory.mktemp(f"tp-{request.param}")
    ckpt = tiny_checkpoint(tmp / "ck", request.param)
    cfg = json.loads((ckpt / "config.json").read_text())
    one = Model(generate(cfg, tmp / "tp1", target="cpu"), ckpt)
    two = Model(generate(cfg, tmp / "tp2", target="cpu", tp=2), ckpt)
    return one, two


def test_two_ranks_give_the_one_device_logits(pair):
    ids = [int(i) for i in np.random.default_rng(0).integers(0, 256, 40)]
    c = compare(*(teacher_forced(m, ids) for m in pair))
    assert c["mean_kl"] < 1e-9 and c["agree_decisive"] == 1.0, c


def test_two_ranks_give_the_one_device_tokens(pair):
    from kern.generation import SamplingParams

    prompts = [[int(i) for i in np.random.default_rng(s).integers(0, 256, 3 + 9 * s)] for s in range(3)]
    one, two = pair
    assert [g.tokens for g in one.generate_batch(prompts, SamplingParams(max_tokens=10))] == \
        [g.tokens for g in two.generate_batch(prompts, SamplingParams(max_tokens=10))]
    assert one.generate(prompts[1], max_tokens=12).tokens == two.generate(prompts[1], max_tokens=12).tokens


def test_every_rank_holds_its_own_heads_and_computes_the_same_logits(pair):
    _, two = pair
    ranks = two.engine.ranks
    assert [e.m.topology.rank for e in ranks] == [0, 1]
    assert ranks[0].m.constants["heads"] == ranks[1].m.constants["heads"] == 2  # 4 heads over 2 ranks
    st = two.protocol.for_rows(1, 1)
    logits = [e.read(st.outputs["logits"], e.env(st.program, st.vars_for(1, 1))) for e in ranks]
    assert np.array_equal(*logits)  # the last step's, on both ranks: bit for bit


def test_one_rank_loaded_alone_is_an_error_not_a_crash(tmp_path):
    """kern test or kern bench given one rank's manifest: its peer tables are never filled, and
    the first all-reduce says so (a LaunchError naming the call) instead of reading address 0."""
    from kern.manifest import load_verified
    from kern.runtime.engine import Engine
    from kern.runtime.errors import LaunchError
    from kern_models.llama.generator import generate

    ckpt = tiny_checkpoint(tmp_path / "ck", "llama")
    man = generate(json.loads((ckpt / "config.json").read_text()), tmp_path / "tp2", target="cpu", tp=2)
    e = Engine(load_verified(man), ckpt)
    st = e.protocol.for_rows(1, 1)
    with pytest.raises(LaunchError, match=r"op all_reduce\) launch 0: collectives.all_reduce_sum failed .*"
                                          "the peer tables are empty"):
        e.run(st.program, st.vars_for(1, 1, reach=64), {st.inputs["token"]: [1], st.inputs["position"]: [0]})


def test_a_bad_step_is_refused_once_before_any_rank_runs(pair):
    """The split deployment checks a step once, on the caller's thread, before any rank writes
    or launches: a token outside the vocabulary is one BoundsError, and every rank's inputs are
    still the last good step's."""
    from kern.errors import BoundsError

    _, two = pair
    st = two.protocol.for_rows(1, 1)
    env = two.engine.env(st.program, st.vars_for(1, 1))
    before = [e.read(st.inputs["token"], env) for e in two.engine.ranks]
    with pytest.raises(BoundsError, match=r"program 'decode': input 'd_ids' holds values in \[9999, 9999\], "
                                          r"outside its domain \[0, 256\); refused before launch"):
        two.engine.run(st.program, st.vars_for(1, 1, reach=8), {st.inputs["token"]: [9999], st.inputs["position"]: [0]})
    assert all(np.array_equal(e.read(st.inputs["token"], env), b) for e, b in zip(two.engine.ranks, before))


def test_a_split_deployment_tells_its_observers_of_each_step_once(pair):
    """kern serve --trace on a split deployment: one line a step, not one a rank."""
    _, two = pair
    seen = []
    two.engine.observers.append(lambda program, env, inputs: seen.append(program))
    try:
        two.generate([5, 6, 7], max_tokens=3)
    finally:
        two.engine.observers.pop()
    st = two.protocol.for_rows(1, 1)
    assert seen and seen.count(st.program) == len(seen) - 1  # one prefill, then one line a decode step


def test_two_ranks_are_batch_invariant_and_reproducible(pair):
    """Not the one device's bytes (docs/tensor-parallel.md: the split sums each fan-in projection's
    K in two halves and adds them, which a single device's K loop does not), but a request's own:
    its row of a four-sequence decode step (and its last prompt row of a four-prompt prefill) has
    the bits it has alone, and again on a second run.
    The all-reduce adds the ranks' parts in rank order, element by element, at every size."""
    from kern.drive.raw_pages import raw

    _, two = pair
    prompts = [[int(i) for i in np.random.default_rng(10 + s).integers(0, 256, 4 + 5 * s)] for s in range(4)]
    pages = [raw(two).take(2) for _ in prompts]
    try:
        first = raw(two).step_many([p[:-1] for p in prompts], [0] * 4, pages, ragged=True)[1]
        alone_first = [raw(two).step_many([p[:-1]], [0], [pg], ragged=True)[1][0] for p, pg in zip(prompts, pages)]
        last = [len(p) - 2 for p in prompts]
        assert all(first[i].tobytes() == a.tobytes() for i, a in enumerate(alone_first))  # prefill, too
        step = ([p[-1:] for p in prompts], [x + 1 for x in last], pages)
        together, again = raw(two).step_many(*step)[1], raw(two).step_many(*step)[1]
        alone = [raw(two).step_many([p[-1:]], [x + 1], [pg])[1][0] for p, x, pg in zip(prompts, last, pages)]
    finally:
        for pg in pages:
            raw(two).give(pg)
    assert together.tobytes() == again.tobytes()
    assert all(together[i].tobytes() == a.tobytes() for i, a in enumerate(alone))
