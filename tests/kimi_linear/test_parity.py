"""The Kimi-Linear cpu reference against transformers eager (fp32 from the same bf16 weights; its
torch recurrence, no fla): teacher-forced logits at every position (KL, argmax agreement where
the reference's top-1/top-2 margin is decisive), and chunked prefill against token by token
(the prompt's recurrence, in either of the cpu deployment's forms, against its one-token step,
the state carried across steps)."""

from __future__ import annotations

import numpy as np
import pytest

from kern.drive.parity import compare, teacher_forced
from kern.drive.raw_pages import raw
from tests.runtime.conftest import reference_logits


def test_teacher_forced_logits_match_transformers(kimi_model, kimi_ckpt):
    ids = np.random.default_rng(1).integers(0, 256, 80).tolist()
    r = compare(reference_logits(kimi_ckpt, ids), teacher_forced(kimi_model, ids))
    assert r["decisive"] >= 60, r  # the sharpened head: most positions are far from a tie
    assert r["mean_kl"] <= 1e-6 and r["max_kl"] <= 1e-4, r
    assert r["agree_decisive"] == 1.0, r


FORMS = pytest.mark.parametrize("form", ["kimi_model", "kimi_chunked"], ids=["token at a time", "chunked"])


@FORMS
def test_prefill_in_one_step_matches_transformers(form, kimi_ckpt, request):
    """One prefill of 40 rows from zeros: the recurrence a token at a time (the deployment's
    default) or in chunks of 16 (two whole, one part; sm_90a's form)."""
    kimi_model = request.getfixturevalue(form)
    ids = np.random.default_rng(3).integers(0, 256, 40).tolist()
    pages = raw(kimi_model).take(3)
    try:
        _, logits = raw(kimi_model).step_rows(ids, 0, pages, ragged=True)
    finally:
        raw(kimi_model).give(pages)
    r = compare(reference_logits(kimi_ckpt, ids)[-1:], logits[None])
    assert r["max_kl"] <= 1e-4, r


@FORMS
def test_chunked_prefill_equals_token_by_token(form, kimi_model, request):
    """Prefill steps continue from the state the last step left (convolution window and
    recurrence); decode steps one token: the same logits at each step's last row (within
    rounding for the chunked form; the default's are the same bytes, tests/kimi_linear/
    test_invariance.py)."""
    stepped = request.getfixturevalue(form)
    ids = np.random.default_rng(2).integers(0, 256, 50).tolist()
    one_by_one = teacher_forced(kimi_model, ids)
    pages = raw(stepped).take(4)
    try:
        pos = 0
        for size in (1, 2, 16, 17, 14):  # inside the window, a chunk +/- 1, a page boundary
            _, logits = raw(stepped).step_rows(ids[pos:pos + size], pos, pages, ragged=True)
            pos += size
            np.testing.assert_allclose(logits, one_by_one[pos - 1], rtol=0, atol=1e-3)
    finally:
        raw(stepped).give(pages)


def test_unpadded_mla_pages_match_transformers(tmp_path):
    """Two MLA layers of the tiny shape (2 x 48 f32 = 384 bytes a token, 3 x 128): the generator
    keeps the token unpadded (pages of 6,144 bytes, 2 MiB and the slot tile 6 MiB), so every MLA
    page and token sits at a stride that is not a power of two. Teacher-forced logits still match
    transformers, and a prompt prefilled in one step or cut in three gives the same bytes."""
    import json

    from kern_models.kimi_linear.generator import generate
    from kern_models.kimi_linear.random_checkpoint import make

    from tests.kimi_linear.conftest import Stepped

    ckpt = make("tiny", tmp_path / "ckpt", max_positions=512,
                layer_types=["linear_attention", "full_attention", "full_attention", "linear_attention"])
    config = json.loads((ckpt / "config.json").read_text())
    man = generate(config, tmp_path / "dep", target="cpu", model="tiny-kimi", tokens=64, seqs=4, context=256)
    assert json.loads(man.read_text())["constants"]["kv_token_bytes"] == 384
    model = Stepped(man, ckpt)
    ids = np.random.default_rng(4).integers(0, 256, 40).tolist()
    forced = teacher_forced(model, ids)
    r = compare(reference_logits(ckpt, ids), forced)
    assert r["mean_kl"] <= 1e-6 and r["max_kl"] <= 1e-4 and r["agree_decisive"] == 1.0, r
    last = []
    for cuts in ([0, 40], [0, 17, 33, 40]):
        pages = raw(model).take(3)
        try:
            for lo, hi in zip(cuts, cuts[1:]):
                _, logits = raw(model).step_rows(ids[lo:hi], lo, pages, ragged=True)
        finally:
            raw(model).give(pages)
        last.append(logits.tobytes())
    assert last[0] == last[1]
    r = compare(reference_logits(ckpt, ids)[-1:], np.frombuffer(last[0], np.float32)[None])
    assert r["max_kl"] <= 1e-4, r
