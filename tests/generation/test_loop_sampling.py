"""Through the loop: sampled requests reproduce by seed whatever runs beside them, logprobs
come one per token, text streams without stop strings, and stop strings end a request."""

from __future__ import annotations

from kern.generation import SamplingParams

from .conftest import make_loop
from .test_detok import ByteTokenizer
from .test_loop import _prompts, _run, _tokens


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
