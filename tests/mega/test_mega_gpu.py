"""The one-kernel manifest on the GPU (random seeded weights of the SmolLM2-135M shape): what
issue 17 promises of it, each a test. Bitwise promises compare bytes, not tolerances."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

CONTEXT = 1024


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """A seeded random SmolLM2-135M; the one bench/mega_gpu.py made already when $MEGA_CKPTS has it."""
    from kern_models.common.random_checkpoint import make

    shared = Path(os.environ.get("MEGA_CKPTS", "/nonexistent")) / "smollm2-135m"
    if (shared / "config.json").is_file():
        return shared
    return make("smollm2-135m", tmp_path_factory.mktemp("ckpt"), device="cuda", max_positions=4096)


def deploy(ckpt, folder, **kw):
    from kern_models.llama.generator import generate

    cfg = json.loads((ckpt / "config.json").read_text())
    return generate(cfg, folder, target=kw.pop("target", "mega"), model="smollm2-135m", context=CONTEXT, **kw)


@pytest.fixture(scope="module")
def mega(ckpt, tmp_path_factory):
    from kern.mega import MegaModel

    return MegaModel(deploy(ckpt, tmp_path_factory.mktemp("mega")), ckpt, sequences=16)


def prompts(n: int, lengths, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 49152, int(lengths[i % len(lengths)])).tolist() for i in range(n)]


def test_a_generation_is_one_launch_and_repeats_token_for_token(mega):
    (p,) = prompts(1, [32])
    a = mega.generate(p, 64)
    assert mega.launches_per_generation == 1
    assert len(a) == 64 and all(0 <= t < 49152 for t in a)
    assert mega.generate(p, 64) == a


def test_prompt_in_chunks_of_8_is_bitwise_token_by_token(mega):
    (p,) = prompts(1, [29], seed=1)
    chunked = mega.prefill(p)                         # one launch: 4 steps of 8, 8, 8, 5 rows
    for pos, t in enumerate(p):                        # the decode program, one row a launch
        alone = mega.decode_step(t, pos)
    assert chunked.dtype == np.float32 and np.isfinite(chunked).all()
    assert chunked.tobytes() == alone.tobytes()


def test_a_batch_of_16_gives_each_sequence_what_it_gets_alone(mega):
    ps = prompts(16, [3, 17, 32, 9, 1, 24], seed=2)
    together = mega.generate_batch(ps, 24)
    for p, t in zip(ps, together):
        assert mega.generate(p, 24) == t


def test_batched_logits_are_bitwise_those_of_each_alone(mega):
    ps = prompts(16, [4], seed=3)  # 64 rows: one step, so logits row i is sequence i
    mega.generate_batch(ps, 1)
    together = mega.engine.read(mega.gen.logits, mega._env)
    for i, p in enumerate(ps):
        assert mega.prefill(p).tobytes() == together[i].tobytes(), f"sequence {i}"


def test_phase_per_launch_debug_mode_is_bitwise_the_fused_kernel(ckpt, mega, tmp_path):
    from kern.mega import MegaModel

    debug = MegaModel(deploy(ckpt, tmp_path / "phases", phases=True), ckpt)
    (p,) = prompts(1, [12], seed=4)
    for pos, t in enumerate(p):
        fused, split = mega.decode_step(t, pos), debug.decode_step(t, pos)
        assert fused.tobytes() == split.tobytes(), f"position {pos}"
    assert len(debug.engine.launches[debug.decode.program]) > 100


def test_mega_agrees_with_transformers_eager(ckpt, mega):
    import torch
    import transformers

    ref = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.bfloat16,
                                                            attn_implementation="eager").cuda().eval()
    (p,) = prompts(1, [32], seed=5)
    with torch.no_grad():
        out = ref.generate(torch.tensor([p], device="cuda"), max_new_tokens=16, do_sample=False)
    hf = out[0, len(p):].tolist()
    ours = mega.generate(p, 16)
    assert np.mean(np.array(ours[:8]) == np.array(hf[:8])) >= 0.75, (ours, hf)


def test_a_grid_that_cannot_be_co_resident_is_refused_before_launch(ckpt, tmp_path):
    from kern.mega import MegaModel
    from kern.runtime.errors import DeviceError

    big = MegaModel(deploy(ckpt, tmp_path / "big", sms=100_000), ckpt)
    with pytest.raises(DeviceError, match="cannot be co-resident"):
        big.decode_step(1, 0)


def test_the_decode_program_captured_as_a_graph_gives_the_same_bits(ckpt, mega, tmp_path):
    from kern.mega import MegaModel

    graphed = MegaModel(deploy(ckpt, tmp_path / "graph", graph=True), ckpt)
    (p,) = prompts(1, [6], seed=6)
    for pos, t in enumerate(p):
        assert graphed.decode_step(t, pos).tobytes() == mega.decode_step(t, pos).tobytes(), f"position {pos}"


def test_kern_test_passes_against_the_per_op_manifest(ckpt, tmp_path):
    from kern.judge.judge import Options, judge

    # The per-op build the megakernel's manifest is made from (batch_invariant=False: its prefill and
    # wide decode are cuBLASLt's), so the decode programs are all that differs.
    a = deploy(ckpt, tmp_path / "a", target="cuda", batch_invariant=False).parent
    b = deploy(ckpt, tmp_path / "b").parent
    # The weights without their tokenizer, so the workload is random tokens: on them the megakernel
    # gives the per-op path's logits bit for bit. On the tokenizer's text the two differ in the last
    # bits (KL 6e-6 on the H200), and a random SmolLM2's near-tie margins never give the 8 decisive
    # rows that logit evidence needs, so the judge could only answer INCONCLUSIVE there.
    weights = tmp_path / "weights"
    weights.mkdir()
    for f in ckpt.iterdir():
        if f.name != "tokenizer.json":
            (weights / f.name).symlink_to(f)
    r = judge(a, b, weights, Options(seed=0, seqs=3, decode_steps=2, max_prompt=48))
    print("\n".join(r.lines + [r.verdict.line]))
    assert r.verdict.status == "PASS", r.verdict.line


def test_qwen3_q_k_norms_pass_kern_test_against_the_per_op_manifest(tmp_path):
    import torch
    import transformers

    from kern.judge.judge import Options, judge
    from kern_models.common.random_checkpoint import word_tokenizer

    cfg = transformers.Qwen3Config(hidden_size=512, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4,
                                   head_dim=128, intermediate_size=1024, vocab_size=4096, tie_word_embeddings=True,
                                   max_position_embeddings=CONTEXT)
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(cfg)
    with torch.no_grad():
        for layer in model.model.layers:  # q/k norm weights start at one: make them matter
            layer.self_attn.q_norm.weight.uniform_(0.5, 1.5)
            layer.self_attn.k_norm.weight.uniform_(0.5, 1.5)
    ckpt = tmp_path / "qwen3"
    model.to(torch.bfloat16).save_pretrained(ckpt)
    word_tokenizer(cfg.vocab_size).save(str(ckpt / "tokenizer.json"))
    a = deploy(ckpt, tmp_path / "a", target="cuda", batch_invariant=False).parent  # as above
    b = deploy(ckpt, tmp_path / "b").parent
    r = judge(a, b, ckpt, Options(seed=0, seqs=2, decode_steps=2, max_prompt=32))
    print("\n".join(r.lines + [r.verdict.line]))
    assert r.verdict.status == "PASS", r.verdict.line
