"""Speculative rounds on the CPU: a verify row computes a decode row's bits, so rounds give
exactly the tokens of plain decoding (greedy and seeded draws alike), alone and batched, with
n-gram proposals and with a draft model; what cannot speculate is refused in one line."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import numpy as np
import pytest

from kern.api import Model
from kern.generation import SamplingParams
from kern.generation.speculative import (NgramProposer, Speculate, SpeculateError, Speculator, ngram_propose,
                                         round_k)

from .conftest import make_loop

torch = pytest.importorskip("torch")


# ---- pure parts ------------------------------------------------------------------------------
def test_ngram_proposes_what_followed_the_latest_longest_match():
    #        0  1  2  3  4  5  6  7  8  9 10 11
    toks = [5, 6, 7, 8, 1, 6, 7, 9, 2, 3, 6, 7]
    # suffix [6, 7] (no 3-token match: [3, 6, 7] is new): its latest earlier occurrence is at 5
    assert ngram_propose(toks, 3) == [9, 2, 3]
    assert ngram_propose(toks, 1) == [9]
    # a longer match wins over a more recent shorter one
    toks = [1, 2, 3, 4, 9, 9, 3, 4, 8, 1, 2, 3, 4]
    assert ngram_propose(toks, 2) == [9, 9]
    # nothing repeats: nothing proposed; a single repeated token is not enough (NGRAM_MIN = 2)
    assert ngram_propose([1, 2, 3, 4, 5], 4) == []
    assert ngram_propose([1, 2, 3, 1], 4) == []
    # a match that runs up to the end proposes what there is
    assert ngram_propose([4, 5, 4, 5], 8) == [4, 5]


def test_a_full_batch_proposes_nothing_and_a_lone_stream_up_to_k():
    assert round_k(1, 8, 32) == 8
    assert round_k(4, 8, 32) == 7  # 4 x 8 rows = 32
    assert round_k(16, 8, 32) == 1
    assert round_k(17, 8, 32) == 0  # past half the bound a round would step more rows than a full batch
    assert round_k(32, 8, 32) == 0


@pytest.mark.parametrize("text,want", [("ngram", Speculate("ngram", 8)), ("ngram:3", Speculate("ngram", 3)),
                                       ("draft:/m/d", Speculate("draft", 8, __import__("pathlib").Path("/m/d"))),
                                       ("draft:/m/d:4", Speculate("draft", 4, __import__("pathlib").Path("/m/d")))])
def test_speculate_values_parse(text, want):
    assert Speculate.parse(text) == want


@pytest.mark.parametrize("text,says", [("ngram:0", "K must be a whole number >= 1"), ("ngram:x", "got 'x'"),
                                       ("draft", "needs the draft model's folder"), ("medusa", "expected ngram")])
def test_bad_speculate_values_are_one_line_naming_the_value(text, says):
    with pytest.raises(SpeculateError) as e:
        Speculate.parse(text)
    assert says in str(e.value) and text in str(e.value) and "\n" not in str(e.value)


# ---- the verify program -----------------------------------------------------------------------
def test_a_verify_row_computes_the_bits_of_a_decode_row(tiny_llama):
    """The same token at the same position over the same cache: the verify program's logits row
    (inside a round of 5 rows) and the decode program's row are the same bytes."""
    loop = make_loop(tiny_llama)
    e, runner = loop.engine, loop.runner
    prompt = list(range(3, 40))
    lease = loop.paging.lease([], 64, cache=False).lease
    from kern.generation.runner import Feed, Units

    loop.paging.extend(lease, prompt, ahead=8)
    runner.run([Feed(prompt, 0, Units.of(lease))], logits=False)
    st = loop.protocol.verify
    tokens, accepted = runner.verify([Feed([7, 8, 9, 10, 11], len(prompt), Units.of(lease))], [[0] * 5])
    v_logits = e.read(_logits_buffer(loop, st.program), e.env(st.program, st.vars_for(1, 5)))[:5].copy()
    for j, t in enumerate([7, 8, 9, 10, 11]):
        got, d_logits = runner.run([Feed([t], len(prompt) + j, Units.of(lease))], logits=True)
        assert np.array_equal(v_logits[j].view(np.uint32), d_logits[0].view(np.uint32)), j
        assert int(tokens[j]) == int(got[0])
    # the proposal [8, 9, 10, 11] kept while it equals the target's argmax after each row
    want = next((j for j, t in enumerate([8, 9, 10, 11]) if t != int(tokens[j])), 4)
    assert int(accepted[0]) == want


def _logits_buffer(loop, program: str) -> str:
    """The buffer the verify program's sample op reads (its logits stay on the device)."""
    m = loop.engine.v.manifest
    call = next(c for c in m.programs[program].calls if c.op == "sample")
    return call.args[0].buf


# ---- rounds give plain decoding's tokens ------------------------------------------------------
def _repetitive(n: int, seed: int) -> list[list[int]]:
    """Prompts that repeat a span of themselves: what n-gram lookup proposes from."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        span = rng.integers(0, 256, int(rng.integers(6, 20))).tolist()
        out.append(span + rng.integers(0, 256, 3).tolist() + span + span[:3])
    return out


def _generate(loop, prompts, params) -> dict[str, list[int]]:
    for i, p in enumerate(prompts):
        loop.add(f"r{i}", p, params[i] if isinstance(params, list) else params)
    got: dict[str, list[int]] = {}
    while loop.has_work():
        for d in loop.step():
            got.setdefault(d.request_id, []).extend(d.token_ids)
    return got


PARAMS = [SamplingParams(max_tokens=24, ignore_eos=True),
          SamplingParams(max_tokens=24, ignore_eos=True, temperature=0.8, seed=11)]


class Oracle(NgramProposer):
    """Proposes what plain decoding made next, every third proposal corrupted: rounds that keep
    all, some and none of their proposals, whatever the text (a random model's draws rarely
    repeat themselves, so n-gram lookup alone would seldom propose)."""

    def __init__(self, plain: dict[str, list[int]], prompts: list[list[int]]):
        self.next = {tuple(p): plain[f"r{i}"] for i, p in enumerate(prompts)}
        self.n = 0

    def propose(self, seqs, ks, keys):
        out = []
        for s, k in zip(seqs, ks):
            made = self.next[tuple(s.prompt)]
            p = made[len(s.out):len(s.out) + k]
            self.n += 1
            if self.n % 3 == 0 and p:
                p[len(p) // 2] = (p[len(p) // 2] + 1) % 256
            out.append(p)
        return out


@pytest.mark.parametrize("params,proposer", [(PARAMS[0], "ngram"), (PARAMS[0], "oracle"), (PARAMS[1], "oracle")],
                         ids=["greedy-ngram", "greedy-oracle", "seeded-oracle"])
def test_rounds_give_the_tokens_of_plain_decoding_alone_and_batched(tiny_llama, params, proposer):
    prompts = _repetitive(5, seed=1)
    plain = _generate(make_loop(tiny_llama), prompts, params)
    for together in (False, True):
        loop = make_loop(tiny_llama)
        loop.speculator = spec = Speculator(Speculate("ngram", 6), NgramProposer() if proposer == "ngram"
                                            else Oracle(plain, prompts))
        if together:
            got = _generate(loop, prompts, params)
        else:
            got = {}
            for i, p in enumerate(prompts):
                got.update({f"r{i}": _generate(loop, [p], params)["r0"]})
        assert got == plain
        s = spec.stats
        # rounds ran, some kept several tokens and some not all: not plain decoding twice
        assert s.rounds > 0 and 0 < s.accepted < s.proposed and s.tokens > s.rounds
    pool = loop.paging.pool
    pool.check()
    assert len(pool.leases) == 1  # the scratch page's: every request's lease came back


def test_a_round_stops_where_the_request_does(tiny_llama):
    """max_tokens inside a round: the request gets exactly max_tokens, the tokens plain
    decoding gives; a stop token inside a round cuts there."""
    prompt = _repetitive(1, seed=3)[0]
    for n in (1, 2, 5):
        params = SamplingParams(max_tokens=n, ignore_eos=True)
        loop = make_loop(tiny_llama)
        loop.speculator = Speculator(Speculate("ngram", 8), NgramProposer())
        assert _generate(loop, [prompt], params)["r0"] == _generate(make_loop(tiny_llama), [prompt], params)["r0"]
    plain = _generate(make_loop(tiny_llama), [prompt], PARAMS[0])["r0"]
    stop = plain[6]
    loop = make_loop(tiny_llama)
    loop.speculator = Speculator(Speculate("ngram", 8), NgramProposer())
    got = _generate(loop, [prompt], replace(PARAMS[0], stop_token_ids=(stop,)))["r0"]
    assert got == plain[:plain.index(stop) + 1]



def favourite(logits: np.ndarray, temperatures) -> tuple[float, np.ndarray, int]:
    """A random model is flat: the first temperature at which one token has p >= 0.3, softmax of
    the logits there, and that token (a proposal both kept and rejected often)."""
    for t in temperatures:
        z = logits.astype(np.float64) / t
        p = np.exp(z - z.max())
        p /= p.sum()
        if p.max() >= 0.3:
            break
    return t, p, int(np.argmax(p))


def follows(draws: list[int], p: np.ndarray, proposal: int, torch) -> None:
    """The draws follow p (chi-square, p-value > 0.001; cells expecting fewer than 5 pooled, the
    test's usual bound), and the proposal was both kept and rejected."""
    counts = np.bincount(draws, minlength=p.size)
    keep = p * len(draws) >= 5
    obs = np.append(counts[keep], counts[~keep].sum())
    exp = np.append(p[keep], p[~keep].sum()) * len(draws)
    obs, exp = obs[exp > 0], exp[exp > 0]
    stat = float(((obs - exp) ** 2 / exp).sum())
    pvalue = float(torch.special.gammaincc(torch.tensor((len(obs) - 1) / 2.0), torch.tensor(stat / 2.0)))
    assert pvalue > 1e-3, (stat, len(obs))
    assert 0.01 < counts[proposal] / len(draws) < 0.99

def test_keyed_rounds_follow_the_targets_distribution(tiny_llama):
    """Rejection sampling keyed by the request: over many seeds, the token a round draws after
    a proposal (kept with the target's probability of it, else drawn among the rest) follows the
    target's softmax(logits / T) at that position (chi-square, p > 0.001), and a seed repeats
    its draw."""
    prompt = _repetitive(1, seed=5)[0]
    loop = make_loop(tiny_llama)
    lease = loop.paging.lease([], 64, cache=False).lease
    from kern.generation.runner import Feed, Units

    loop.paging.extend(lease, prompt[:-1], ahead=4)
    loop.runner.run([Feed(prompt[:-1], 0, Units.of(lease))], logits=False)
    _, logits = loop.runner.run([Feed([prompt[-1]], len(prompt) - 1, Units.of(lease))], logits=True)
    t, p, proposal = favourite(logits[0], (1.0, 0.5, 0.2, 0.1, 0.05, 0.02))
    from kern.generation.keys import draw_key

    draws = []
    for seed in range(3000):
        tok, acc = loop.runner.verify([Feed([prompt[-1], proposal], len(prompt) - 1, Units.of(lease), t)],
                                      [[draw_key(seed, 0), draw_key(seed, 1)]])
        assert int(acc[0]) == int(tok[0] == proposal)
        draws.append(int(tok[0]))
    follows(draws, p, proposal, torch)
    again, _ = loop.runner.verify([Feed([prompt[-1], proposal], len(prompt) - 1, Units.of(lease), t)],
                                  [[draw_key(7, 0), draw_key(7, 1)]])
    assert int(again[0]) == draws[7]


# ---- a deployment that cannot speculate --------------------------------------------------------
def test_a_deployment_without_a_verify_program_is_refused_in_one_line(tiny_llama, tmp_path):
    ckpt, manifest = tiny_llama
    m = json.loads(manifest.read_text())
    del m["programs"]["verify_round"]
    for name in [n for n in m["buffers"] if n.startswith("v_")]:
        del m["buffers"][name]
    del m["ops"]["accept"]
    (tmp_path / "kernels").symlink_to(manifest.parent / "kernels")
    (tmp_path / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(SpeculateError) as e:
        Model(tmp_path / "manifest.json", ckpt, state_budget=16 << 20, speculate="ngram")
    assert "declares no verify program" in str(e.value) and "\n" not in str(e.value)


# ---- a draft model -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def draft_pair(tmp_path_factory):
    """A random tiny llama target and a smaller random draft of the same vocabulary, each with
    the same word tokenizer (models/common/random_checkpoint.py)."""
    import transformers
    from kern_models.common.random_checkpoint import save, seeded

    def make(name, seed, **shape):
        cfg = transformers.LlamaConfig(vocab_size=256, max_position_embeddings=512, tie_word_embeddings=False,
                                       **shape)

        def sharpen(model):  # random logits are near-ties everywhere: a draft agrees with nothing
            with torch.no_grad():
                model.lm_head.weight.mul_(8.0)
        folder = tmp_path_factory.mktemp(name)
        save(seeded(transformers.LlamaForCausalLM, cfg, seed=seed, device="cpu", sharpen=sharpen), folder)
        return folder

    target = make("target", 0, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=128)
    draft = make("draft", 1, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                 intermediate_size=64)
    return target, draft


def _model(folder, speculate=None):
    from kern.api import deployment_for

    return Model(deployment_for(folder, "cpu"), folder, state_budget=32 << 20, speculate=speculate)


@pytest.mark.parametrize("params", PARAMS, ids=["greedy", "seeded"])
def test_a_draft_model_gives_the_tokens_of_plain_decoding(draft_pair, params):
    """Greedy and seeded, alone and batched: the tokens plain decoding gives. A draft that is the
    target itself computes the target's own tokens (the same kernels, a row alone), so every
    proposal is kept (k + 1 tokens a round); the smaller random draft's acceptance is reported,
    meaningless beyond showing rounds keep some and reject some."""
    target, small = draft_pair
    prompts = _repetitive(4, seed=7)
    plain = _generate(_model(target).loop, prompts, params)
    for draft in (target, small):
        for together in (False, True):
            model = _model(target, f"draft:{draft}:4")
            if together:
                got = _generate(model.loop, prompts, params)
            else:
                got = {f"r{i}": _generate(model.loop, [p], params)["r0"] for i, p in enumerate(prompts)}
            assert got == plain
            s = model.loop.speculator.stats
            assert s.rounds > 0 and s.proposed > 0
            if draft == target:
                assert s.accepted == s.proposed
            else:
                print(f"\nrandom draft ({params.temperature=}, together={together}): acceptance {s.acceptance:.2f}, "
                      f"{s.tokens_per_round:.2f} tokens a round")
            draft_pool = model.loop.speculator.proposer.paging.pool
            model.loop.speculator.proposer.release(set())
            draft_pool.check()
            assert len(draft_pool.leases) == 1  # the draft's scratch page: every sequence's draft lease came back


def test_a_draft_of_another_vocabulary_is_refused_in_one_line(draft_pair, tmp_path):
    import transformers
    from kern_models.common.random_checkpoint import save, seeded

    target, _ = draft_pair
    cfg = transformers.LlamaConfig(vocab_size=128, max_position_embeddings=512, hidden_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, intermediate_size=64)
    save(seeded(transformers.LlamaForCausalLM, cfg, seed=2, device="cpu"), tmp_path)
    with pytest.raises(Exception) as e:
        _model(target, f"draft:{tmp_path}")
    assert "vocabulary" in str(e.value) and "\n" not in str(e.value)


def test_kern_run_speculates_and_says_how_it_went(draft_pair, capsys):
    from kern.cli import main

    target, small = draft_pair
    prompt = " ".join(f"w{t}" for t in _repetitive(1, seed=9)[0])
    run = ["run", str(target), "--prompt", prompt, "--max-tokens", "24", "--target", "cpu"]
    assert main(run) == 0
    plain = capsys.readouterr()
    for spec in ("ngram:4", f"draft:{small}:3"):
        assert main([*run, "--speculate", spec]) == 0
        got = capsys.readouterr()
        assert got.out == plain.out
        assert re.search(rf"\| speculative \({re.escape(spec)}\): \d+\.\d\d tokens a round, \d+% of \d+ proposed kept",
                         got.err), got.err
    assert main([*run, "--speculate", f"draft:{target / 'nothing'}"]) == 1
    assert "is not a folder" in capsys.readouterr().err


def test_rounds_under_a_budget_that_preempts_give_the_same_tokens_and_give_memory_back(tiny_llama):
    """One chunk of state for 16 requests promised 16 tokens past their prompts: rounds bind
    their rows' pages before they run (a proposal the budget cannot hold is dropped), the
    youngest requests are preempted and resume from their checkpoints, and every request gets
    the tokens plain decoding gives it; afterwards only the scratch page is leased."""
    prompts = _repetitive(16, seed=11)  # up to 45 + 300 tokens each: more than the chunk's 4,096 together
    params = [SamplingParams(max_tokens=300, ignore_eos=True, temperature=0.8 if i % 3 == 0 else 0.0, seed=i)
              for i in range(16)]
    plain = _generate(make_loop(tiny_llama, headroom=None), prompts, params)
    loop = make_loop(tiny_llama, state_budget=1, headroom=16)
    loop.speculator = spec = Speculator(Speculate("ngram", 8), Oracle(plain, prompts))
    preempted = []
    real = loop.scheduler.preempt
    loop.scheduler.preempt = lambda s: (preempted.append(s.id), real(s))
    assert _generate(loop, prompts, params) == plain
    assert preempted and spec.stats.rounds > 0 and spec.stats.accepted > 0
    loop.paging.pool.check()
    assert len(loop.paging.pool.leases) == 1


def test_a_verify_program_without_a_role_it_needs_is_named_where_rounds_are_asked_for(tiny_llama):
    from dataclasses import replace as swap

    from kern.manifest.protocol import verify_problem

    loop = make_loop(tiny_llama)
    st = loop.protocol.verify
    assert verify_problem(st) is None
    no_rng = swap(st, inputs={r: b for r, b in st.inputs.items() if r != "rng"})
    assert verify_problem(no_rng) == (
        "program 'verify_round' has an `accepted` output, so it verifies speculative rounds: it must be ragged (rows a "
        "var) with roles accepted, cu_seqlens, position, rng, temperature, token, tokens (missing: rng)")
    assert "must be ragged" in verify_problem(swap(st, rows=1, rows_var=None))
