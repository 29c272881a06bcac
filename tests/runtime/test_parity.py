"""kern's cpu device against transformers eager (fp32 from the same bf16 weights)."""

from __future__ import annotations

import numpy as np
import pytest

from kern.api import Model

from .conftest import reference_logits
from kern.drive.parity import compare, teacher_forced
from kern.drive.raw_pages import raw

POSITIONS = 160


def test_tiny_models_match_transformers_teacher_forced(tiny):
    ckpt, manifest = tiny
    model = Model(manifest, ckpt)
    ids = np.random.default_rng(1).integers(0, 256, POSITIONS).tolist()
    got = teacher_forced(model, ids)
    r = compare(reference_logits(ckpt, ids), got)
    assert r["rows"] >= 128
    assert r["mean_kl"] <= 1e-3, r
    assert r["agree_decisive"] >= 0.99, r


def test_embedded_model_matches_transformers_on_natural_text(smollm2, smollm2_model):
    text = ("The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
            "combined movable metal type, oil-based inks and a wooden screw press into a system that could "
            "produce books quickly and cheaply. Before that, books were copied by hand, usually by monks "
            "working in monasteries, and a single volume could take months to finish. The new presses spread "
            "across Europe within a few decades, and by the year 1500 millions of books had been printed. "
            "Cheaper books meant that more people learned to read, and ideas travelled faster than ever. "
            "Scientists could share their results with colleagues in distant cities, merchants kept better "
            "records, and governments printed laws so that everyone could know them.")
    ids = smollm2_model.tokenizer.encode(text)
    assert len(ids) >= 128
    got = teacher_forced(smollm2_model, ids)
    r = compare(reference_logits(smollm2, ids), got)
    assert r["mean_kl"] <= 1e-3, r
    assert r["agree_decisive"] >= 0.99, r


def test_chunked_prefill_equals_token_by_token(tiny):
    ckpt, manifest = tiny
    model = Model(manifest, ckpt)
    ids = np.random.default_rng(2).integers(0, 256, 70).tolist()
    one_by_one = teacher_forced(model, ids)
    pages = raw(model).take(5)
    try:
        pos = 0
        for size in (1, 16, 17, 15, 21):  # page boundaries +/- 1, a single-row prefill
            _, logits = raw(model).step_rows(ids[pos:pos + size], pos, pages, ragged=True)
            pos += size
            np.testing.assert_allclose(logits, one_by_one[pos - 1], rtol=0, atol=1e-4)
    finally:
        raw(model).give(pages)


def test_batched_decode_gives_each_sequence_its_own_tokens(smollm2_model):
    m = smollm2_model
    prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,"]
    alone = [m.generate(p, max_tokens=8).tokens for p in prompts]

    # all three together: prefill each, then decode them as one batch of 3 groups x 1 row
    pages = [raw(m).take(4) for _ in prompts]
    seqs = [m.tokenizer.encode(p) for p in prompts]
    nxt = [raw(m).step_rows(s, 0, pg, ragged=True)[0] for s, pg in zip(seqs, pages)]
    out = [[t] for t in nxt]
    st = m.protocol.for_rows(3, 1)
    (table,) = st.page_tables
    width = m.engine.shapes[table.buffer][1]
    for step in range(7):
        pt = np.zeros((3, width), np.int32)
        for i, pg in enumerate(pages):
            pt[i, :len(pg)] = pg
        pos = np.array([len(s) + step for s in seqs], np.int32)
        env = m.engine.run(st.program, st.vars_for(3, 3), {
            st.inputs["token"]: np.array([o[-1] for o in out], np.int32),
            st.inputs["position"]: pos, table.buffer: pt})
        for o, t in zip(out, m.engine.read(st.outputs["tokens"], env)):
            o.append(int(t))
    for pg in pages:
        raw(m).give(pg)
    for a, b in zip(alone, out):
        n = len(a)  # a sequence that stopped at eos early compares up to there
        assert b[:n] == a


def test_greedy_generation_matches_transformers(smollm2, smollm2_model):
    import torch
    import transformers

    m = smollm2_model
    ids = m.tokenizer.encode(m.tokenizer.chat([{"role": "user", "content": "Name three colors."}]))
    ours = m.generate(ids, max_tokens=16).tokens
    ref = transformers.AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval()
    with torch.no_grad():
        gen = ref.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False)[0, len(ids):].tolist()
    n = min(len(ours), len(gen))
    assert n >= 1
    assert ours[:16] == gen[:16]


def test_a_cached_prefix_gives_the_same_tokens_as_a_cold_prompt(smollm2_model):
    m = smollm2_model
    system = "You are a careful assistant. Answer in one short sentence. "
    first = m.generate(system + "What is the largest planet?", max_tokens=12)
    cold_pool = m.paging.pool
    warm = m.generate(system + "What is the smallest planet?", max_tokens=12)
    assert warm.cached_tokens >= 8  # the shared system prompt came from the checkpoint
    cold_pool.clear()  # forget every checkpoint: the same prompt again, from nothing
    cold = m.generate(system + "What is the smallest planet?", max_tokens=12)
    assert cold.cached_tokens == 0
    assert warm.tokens == cold.tokens
    assert first.tokens  # the first request ran
    cold_pool.check()


def test_one_prefill_step_of_several_sequences_equals_each_alone(tiny):
    ckpt, manifest = tiny
    model = Model(manifest, ckpt)
    rng = np.random.default_rng(3)
    seqs = [rng.integers(0, 256, n).tolist() for n in (5, 17, 33)]  # page boundaries +/- 1
    pages = [raw(model).take(3) for _ in seqs]
    try:
        alone = [raw(model).step_rows(s, 0, pg, ragged=True)[1] for s, pg in zip(seqs, pages)]
        st = model.protocol.for_rows(3, None)
        (table,) = st.page_tables
        pt = np.zeros((3, model.engine.shapes[table.buffer][1]), np.int32)
        for i, pg in enumerate(pages):
            pt[i, :len(pg)] = pg
        rows = sum(len(s) for s in seqs)
        env = model.engine.run(st.program, st.vars_for(3, rows), {
            st.inputs["token"]: np.concatenate(seqs).astype(np.int32),
            st.inputs["position"]: np.concatenate([np.arange(len(s)) for s in seqs]).astype(np.int32),
            st.inputs["cu_seqlens"]: np.cumsum([0] + [len(s) for s in seqs]).astype(np.int32),
            table.buffer: pt})
        together = model.engine.read(st.outputs["logits"], env)
    finally:
        for pg in pages:
            raw(model).give(pg)
    for a, b in zip(alone, together):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-4)
