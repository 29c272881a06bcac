"""The peers of bench/decode.py, run on the CPU with a tiny random llama: the hand-written
static-cache loop (the torch.compile peer, here uncompiled) must generate the same greedy
tokens as transformers' own cache loop, or its speed would be a number for a different job."""

from __future__ import annotations


import numpy as np
import pytest

from tests.benchmarks import scripts

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

def _decode_bench():
    return scripts.load("decode", "bench_decode")


def test_static_cache_loop_generates_what_the_eager_loop_does():
    bench = _decode_bench()
    torch.manual_seed(0)
    # large initial weights: sharp attention, so the tokens depend on the cache being right
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=97, max_position_embeddings=128,
                                   initializer_range=0.5)
    ref = transformers.LlamaForCausalLM(cfg).eval()
    prompts = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 7)).astype(np.int32)
    eager = bench.run_hf(ref, prompts, 24, device="cpu")
    static = bench.run_compiled(ref, prompts, 24, device="cpu", mode=None)
    assert np.array(eager["tokens"]).shape == (2, 23)
    assert static["tokens"] == eager["tokens"]


def test_kern_run_ahead_generates_what_single_steps_do(tmp_path):
    """bench/decode.py's kern loop with 4 steps a host sync (Engine.run_steps) against one step
    a sync, on the CPU device with a tiny random llama: the same greedy tokens."""
    from kern.api import Model, deployment_for

    bench = _decode_bench()
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=97, max_position_embeddings=128,
                                   initializer_range=0.5, tie_word_embeddings=False)
    transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(tmp_path)
    model = Model(deployment_for(tmp_path, "cpu"), tmp_path)
    prompts = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 7)).astype(np.int32)
    one = bench.run_kern(model, prompts, 22, ahead=1)
    four = bench.run_kern(model, prompts, 22, ahead=4)
    n = len(four["tokens"][0])
    assert n == 1 + 4 + 16  # the capture chunk, then four timed chunks of four
    assert [t[:n] for t in one["tokens"]] == four["tokens"]
