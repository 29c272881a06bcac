"""Pipeline stages on GPUs (kern.world.staged): a small random llama's sm_90a deployment cut
into two stages, against the uncut deployment on one GPU, bit for bit. On two GPUs the stages
sit on GPU 0 and GPU 1 and the hand-over is a peer copy (cuMemcpyPeerAsync); on one GPU both
stages sit on GPU 0 (the hand-over a device copy), which checks everything but the peer copy."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

CONFIG = dict(hidden_size=1024, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2, head_dim=64,
              intermediate_size=1024, vocab_size=512, max_position_embeddings=1024, tie_word_embeddings=False)
PROMPTS = [[int(i) for i in np.random.default_rng(s).integers(0, 512, 5 + 7 * s)] for s in range(6)]


def _gpus() -> int:
    from kern.runtime.devices.cuda.driver import call, open_device

    open_device(0)
    return call("cuDeviceGetCount")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    import torch
    import transformers

    tmp = tmp_path_factory.mktemp("pp")
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).to(torch.bfloat16).save_pretrained(tmp / "ck")
    return tmp / "ck"


@pytest.fixture(scope="module", params=["two_gpus", "one_gpu"])
def pair(request, ckpt, tmp_path_factory):
    from kern.api import Model
    from kern.world import stage_links
    from kern_models.llama.generator import generate

    gpus = _gpus()
    if request.param == "two_gpus" and gpus < 2:
        pytest.skip("pipeline stages across GPUs need two")
    man = generate(json.loads((ckpt / "config.json").read_text()), tmp_path_factory.mktemp("dep"), target="cuda")
    one = Model(man, ckpt, state_budget=256 << 20)
    if request.param == "one_gpu":  # both stages on GPU 0
        mp = pytest.MonkeyPatch()
        mp.setattr(stage_links, "ordinals", lambda v, n: [0] * n)
        try:
            two = Model(man, ckpt, state_budget=256 << 20, pp=2)
        finally:
            mp.undo()
    else:
        two = Model(man, ckpt, state_budget=256 << 20, pp=2)
    return one, two


def test_the_stages_sit_where_asked(pair):
    _, two = pair
    ordinals = [e.device.dev.ordinal for e in two.engine.stages]
    assert ordinals in ([0, 1], [0, 0])


def test_teacher_forced_logits_are_the_one_gpus_bytes(pair):
    from kern.drive.parity import teacher_forced

    ids = [int(i) for i in np.random.default_rng(1).integers(0, 512, 40)]
    one, two = pair
    assert teacher_forced(one, ids).tobytes() == teacher_forced(two, ids).tobytes()


def test_a_micro_batched_decode_step_gives_the_one_gpus_bytes(pair):
    from kern.drive.raw_pages import raw

    out = []
    for m in pair:
        pages = [raw(m).take(2) for _ in range(4)]
        try:
            for p, pg in zip(PROMPTS, pages):
                raw(m).step_rows(p, 0, pg, ragged=True)
            out.append(raw(m).step_many([p[:1] for p in PROMPTS[:4]], [len(p) for p in PROMPTS[:4]], pages))
        finally:
            for pg in pages:
                raw(m).give(pg)
    (t1, l1), (t2, l2) = out
    assert t1.tobytes() == t2.tobytes() and l1.tobytes() == l2.tobytes()


def test_generated_tokens_are_the_one_gpus(pair):
    from kern.generation import SamplingParams

    one, two = pair
    params = SamplingParams(max_tokens=16)
    assert [g.tokens for g in one.generate_batch(PROMPTS, params)] == \
        [g.tokens for g in two.generate_batch(PROMPTS, params)]
