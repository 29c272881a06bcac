"""Through the loop: sampled requests reproduce by seed whatever runs beside them, logprobs
come one per token, text streams without stop strings, and stop strings end a request."""

from __future__ import annotations

from kern.generation import SamplingParams

from .conftest import make_loop
from .test_detok import ByteTokenizer
from .test_loop import _prompts, _run, _tokens



def unmasked(logits):
    """The sample op's mask inputs for rows drawn over every token: one row of words, no row masked."""
    import numpy as np

    return np.zeros((1, -(-logits.shape[1] // 32)), np.int32), np.zeros(len(logits), np.int32)

def _text_loop(tiny_llama):
    loop = make_loop(tiny_llama)
    loop.tokenizer = ByteTokenizer()  # the tiny model's 256 tokens read as bytes
    return loop


def test_a_seeded_request_gives_the_same_tokens_alone_and_in_a_batch(tiny_llama):
    p = SamplingParams(max_tokens=10, temperature=1.0, top_p=0.9, seed=11, ignore_eos=True)
    prompts = _prompts(4, seed=5)
    loop = make_loop(tiny_llama)
    alone = _tokens(_run(loop, {0: [("s", prompts[0], p)]})["s"])
    assert _tokens(_run(loop, {0: [("s2", prompts[0], p)]})["s2"]) == alone  # and again, from the cache
    others = [(f"o{i}", prompts[i], SamplingParams(max_tokens=8, temperature=0.7, seed=i)) for i in range(1, 4)]
    got = _run(make_loop(tiny_llama, budget=16), {0: others[:2], 1: [("s", prompts[0], p)], 2: others[2:]})
    assert _tokens(got["s"]) == alone
    other_seed = _tokens(_run(loop, {0: [("t", prompts[0], SamplingParams(
        max_tokens=10, temperature=1.0, top_p=0.9, seed=12, ignore_eos=True))]})["t"])
    assert other_seed != alone


def test_logprobs_come_one_per_token_with_the_top_k(tiny_llama):
    loop = make_loop(tiny_llama)
    got = _run(loop, {0: [("g", [1, 2, 3], SamplingParams(max_tokens=6, logprobs=3, ignore_eos=True)),
                          ("n", [4, 5], SamplingParams(max_tokens=6, ignore_eos=True))]})
    lps = [lp for d in got["g"] for lp in d.logprobs]
    assert [lp.token for lp in lps] == _tokens(got["g"])
    assert all(len(lp.top) == 3 and lp.top[0][0] == lp.token for lp in lps)  # greedy: the best is chosen
    assert all(d.logprobs == () for d in got["n"])


def test_text_streams_whole_and_a_stop_string_ends_the_request(tiny_llama):
    loop = _text_loop(tiny_llama)
    prompt = _prompts(6)[4]
    full = _run(loop, {0: [("a", prompt, SamplingParams(max_tokens=16, ignore_eos=True))]})["a"]
    tokens = _tokens(full)
    text = "".join(d.text for d in full)
    assert text == ByteTokenizer().decode(tokens).rstrip("\ufffd")
    cut = next(i for i in range(3, len(tokens)) if ByteTokenizer().decode(tokens[:i]) != "")
    prefix = ByteTokenizer().decode(tokens[:cut])
    stop = text[len(prefix):len(prefix) + 2] if len(text) >= len(prefix) + 2 else text[-1:]
    want = text[:text.index(stop)]
    got = _run(loop, {0: [("b", prompt, SamplingParams(max_tokens=16, stop=(stop,), ignore_eos=True))]})["b"]
    assert got[-1].finish_reason == "stop" and "".join(d.text for d in got) == want


def test_stop_token_ids_end_the_request_with_the_token_counted(tiny_llama):
    loop = make_loop(tiny_llama)
    prompt = _prompts(6)[1]
    tokens = _tokens(_run(loop, {0: [("a", prompt, SamplingParams(max_tokens=12, ignore_eos=True))]})["a"])
    stop = tokens[5]
    got = _run(loop, {0: [("b", prompt, SamplingParams(max_tokens=12, stop_token_ids=(stop,)))]})["b"]
    assert _tokens(got) == tokens[:tokens.index(stop) + 1] and got[-1].finish_reason == "stop"


def test_plain_temperature_rows_are_drawn_on_the_device_with_no_logits_copied(tiny_llama):
    """Temperature without truncation, penalty or logprobs (the OpenAI default) is the manifest's
    sample op's draw: the host never asks for logits, and a seed reproduces the tokens alone or
    batched beside others; another seed gives others. A top_p row still reads its logits."""
    loop = make_loop(tiny_llama)
    asked: list[bool] = []
    real = loop.runner.run
    loop.runner.run = lambda feeds, logits: (asked.append(logits), real(feeds, logits))[1]
    p = SamplingParams(max_tokens=10, temperature=1.0, seed=3, ignore_eos=True)
    prompts = _prompts(4, seed=9)
    alone = _tokens(_run(loop, {0: [("a", prompts[0], p)]})["a"])
    assert loop.runner.samples and asked and not any(asked)
    others = [(f"o{i}", prompts[i], SamplingParams(max_tokens=6, temperature=0.8, seed=i)) for i in range(1, 4)]
    got = _run(make_loop(tiny_llama, budget=16), {0: others[:2], 1: [("a", prompts[0], p)], 2: others[2:]})
    assert _tokens(got["a"]) == alone
    reseeded = SamplingParams(max_tokens=10, temperature=1.0, seed=4, ignore_eos=True)
    assert _tokens(_run(loop, {0: [("b", prompts[0], reseeded)]})["b"]) != alone
    asked.clear()
    _run(loop, {0: [("c", prompts[0], SamplingParams(max_tokens=3, temperature=1.0, top_p=0.5, seed=1))]})
    assert any(asked)


def test_the_sample_op_draws_follow_the_softmax_at_the_temperature():
    """The cpu sample op (the formula of cuda/argmax.cu) over many keys: chi-square against
    softmax(logits / T) at p = 0.001, and T = 0 is the argmax whatever the key."""
    import numpy as np

    from kern.generation.loop import draw_key
    from kern_models.llama.kernels.cpu.kernels import sample

    rng = np.random.default_rng(2)
    n, vocab, t = 3000, 6, 0.6
    logits = np.tile(rng.standard_normal(vocab).astype(np.float32), (n, 1))
    keys = np.array([draw_key(7, i) for i in range(n)], "<u8").view("<i4").reshape(n, 2)
    got = np.empty(n, np.int32)
    sample(logits, np.full(n, t, np.float32), keys, *unmasked(logits), got)
    p = np.exp(logits[0] / t - np.max(logits[0] / t))
    p /= p.sum()
    counts = np.bincount(got, minlength=vocab)
    chi2 = float(np.sum((counts - n * p) ** 2 / (n * p)))
    assert chi2 < 20.5, f"chi-square {chi2:.1f} over {vocab - 1} degrees of freedom"
    sample(logits, np.zeros(n, np.float32), keys, *unmasked(logits), got)
    assert (got == np.argmax(logits[0])).all()


def test_a_token_leading_by_100_nats_is_drawn_in_every_one_of_100000_draws():
    """The cpu sample op's Gumbel noise stays finite: u strictly inside (0, 1) in float32. (With
    24 random bits the largest u rounded up to 1.0, its noise was +inf and that token won
    whatever its logit: about one draw in 340 over a 49,152-token vocabulary.)"""
    import numpy as np

    from kern.generation.loop import draw_key
    from kern_models.llama.kernels.cpu.kernels import sample

    draws, rows, vocab, best = 100_000, 10_000, 2048, 5
    logits = np.zeros((rows, vocab), np.float32)
    logits[:, best] = 100.0
    got = np.empty(rows, np.int32)
    for start in range(0, draws, rows):
        keys = np.array([draw_key(3, start + i) for i in range(rows)], "<u8").view("<i4").reshape(rows, 2)
        sample(logits, np.ones(rows, np.float32), keys, *unmasked(logits), got)
        assert (got == best).all(), f"draw {start + int(np.argmax(got != best))} took token {got[got != best][0]}"


def test_a_subnormal_temperature_is_greedy(tiny_llama):
    """Temperatures below 1e-6 act as greedy (docs/serve.md): the device divides by T in float32,
    where 1 / 1e-40 overflows and every scaled logit was inf or NaN."""
    from kern.generation.params import GREEDY_BELOW

    prompt = _prompts(1, seed=8)[0]
    loop = make_loop(tiny_llama)
    greedy = _tokens(_run(loop, {0: [("g", prompt, SamplingParams(max_tokens=8, ignore_eos=True))]})["g"])
    for i, t in enumerate((1e-40, 5e-324, GREEDY_BELOW / 2)):
        p = SamplingParams(max_tokens=8, temperature=t, seed=i, ignore_eos=True)
        assert p.greedy
        assert _tokens(_run(loop, {0: [(f"t{i}", prompt, p)]})[f"t{i}"]) == greedy, t
    assert not SamplingParams(temperature=GREEDY_BELOW).greedy


def test_nan_never_wins_the_sample_op_as_on_the_device():
    """The cpu op answers what cuda/argmax.cu does: a NaN logit is never the token (np.argmax
    alone would pick the first NaN), ties go to the lowest index, a row of only NaN gives -1."""
    import numpy as np

    from kern_models.llama.kernels.cpu.kernels import sample

    nan, inf = np.nan, np.inf
    rows = [([nan, 1, 5, nan], 2), ([1, nan, 1, 0], 0), ([-inf, nan, -inf, -inf], 0), ([nan] * 4, -1)]
    logits = np.array([r for r, _ in rows], np.float32)
    keys = np.arange(2 * len(rows), dtype=np.int32).reshape(len(rows), 2)
    got = np.empty(len(rows), np.int32)
    sample(logits, np.zeros(len(rows), np.float32), keys, *unmasked(logits), got)
    assert got.tolist() == [want for _, want in rows]
    sample(logits[:1], np.full(1, 0.7, np.float32), keys[:1], *unmasked(logits[:1]), got[:1])
    assert got[0] in (1, 2)
