"""Whole models on the GPU: kern's sm_90a manifests against transformers (random seeded weights
at real shapes), chunked prefill against token by token, graph replay against eager launches."""

from __future__ import annotations

import json

import numpy as np
import pytest
from kern.drive.raw_pages import raw

pytestmark = pytest.mark.gpu

SHAPES = ["smollm2-135m", "qwen3-0.6b", "llama-3.2-1b"]


@pytest.fixture(scope="module", params=SHAPES)
def model(request, tmp_path_factory):
    from kern.api import Model
    from kern_models.llama.generator import generate
    from kern_models.common.random_checkpoint import make

    tmp = tmp_path_factory.mktemp(request.param)
    ckpt = make(request.param, tmp / "ckpt", device="cuda")
    man = generate(json.loads((ckpt / "config.json").read_text()), tmp / "deploy", target="cuda",
                   model=request.param)
    return Model(man, ckpt, state_budget=1 << 30)


def _teacher_forced(model, ids):
    pages = raw(model).take(-(-len(ids) // model.page_tokens))
    try:
        return np.stack([raw(model).step_rows([t], i, pages)[1] for i, t in enumerate(ids)])
    finally:
        raw(model).give(pages)


def _hf(ckpt, ids, attn):
    import torch
    import transformers

    ref = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.bfloat16,
                                                            attn_implementation=attn).cuda().eval()
    with torch.no_grad():
        return ref(torch.tensor([ids], device="cuda")).logits[0].float().cpu().numpy()


def test_teacher_forced_argmax_within_transformers_own_spread(model):
    vocab = model.verified.constants["vocab"]
    ids = np.random.default_rng(0).integers(0, vocab, 160).tolist()
    eager, sdpa = _hf(model.checkpoint, ids, "eager"), _hf(model.checkpoint, ids, "sdpa")
    ours = _teacher_forced(model, ids)
    spread = float(np.mean(eager.argmax(-1) != sdpa.argmax(-1)))
    ours_off = float(np.mean(eager.argmax(-1) != ours.argmax(-1)))
    print(f"argmax disagreement with eager: kern {ours_off:.3f}, sdpa {spread:.3f}")
    assert ours_off <= 2 * spread + 0.02


def test_chunked_prefill_equals_token_by_token(model):
    vocab = model.verified.constants["vocab"]
    ids = np.random.default_rng(1).integers(0, vocab, 70).tolist()
    one = _teacher_forced(model, ids)
    pages = raw(model).take(5)
    try:
        pos = 0
        for size in (16, 17, 15, 22):
            _, logits = raw(model).step_rows(ids[pos:pos + size], pos, pages, ragged=True)
            pos += size
            a, b = one[pos - 1], logits
            assert a.argmax() == b.argmax() or np.sort(a)[-1] - np.sort(a)[-2] < 0.05
            assert np.max(np.abs(a - b)) < 0.1 * max(1.0, np.max(np.abs(a)))
    finally:
        raw(model).give(pages)


def test_graph_replay_is_bitwise_equal_to_eager_launches(model):
    eng = model.engine
    st = model.protocol.for_rows(4, 1)
    (table,) = st.page_tables
    pages = raw(model).take(4 * 2)
    pt = np.zeros((4, eng.shapes[table.buffer][1]), np.int32)
    pt[:, :2] = np.array(pages, np.int32).reshape(4, 2)
    inputs = {st.inputs["token"]: np.array([5, 6, 7, 8], np.int32),
              st.inputs["position"]: np.array([3, 9, 17, 30], np.int32),
              st.inputs["cu_seqlens"]: np.arange(5, dtype=np.int32), table.buffer: pt}
    try:
        env = eng.run(st.program, st.vars_for(4, 4), inputs)  # captures the graph and replays it
        graph = eng.read(st.outputs["logits"], env)
        env = eng.run(st.program, st.vars_for(4, 4), inputs)
        again = eng.read(st.outputs["logits"], env)
        # the same launches one by one: the program lowered again, not as a graph
        eng.device.lower(eng.launches[st.program], eng.buffers, eng.states).run(env)
        eager = eng.read(st.outputs["logits"], env)
    finally:
        raw(model).give(pages)
    assert np.isfinite(graph).all()
    assert graph.tobytes() == again.tobytes() == eager.tobytes()


def test_k_decode_steps_in_one_graph_equal_k_single_steps(model):
    """Engine.run_steps: six steps, the token fed back on the device, one graph launch: the same
    tokens and the same last logits, bit for bit, as six single steps."""
    eng, k = model.engine, 6
    st = model.protocol.for_rows(4, 1)
    (table,) = st.page_tables
    tok, pos, out, logits = st.inputs["token"], st.inputs["position"], st.outputs["tokens"], st.outputs["logits"]
    pages = raw(model).take(4 * 3)
    pt = np.zeros((4, eng.shapes[table.buffer][1]), np.int32)
    pt[:, :3] = np.array(pages, np.int32).reshape(4, 3)
    start = np.array([3, 9, 17, 30], np.int32)
    inputs = {tok: np.array([5, 6, 7, 8], np.int32), pos: start,
              st.inputs["cu_seqlens"]: np.arange(5, dtype=np.int32), table.buffer: pt}
    v = st.vars_for(4, 4)
    try:
        loop, step = [], dict(inputs)
        for j in range(k):
            env = eng.run(st.program, v, step)
            loop.append(eng.read(out, env).tolist())
            last = eng.read(logits, env)
            step = {**step, tok: np.array(loop[-1], np.int32), pos: start + j + 1}
        outs = eng.run_steps(st.program, v, inputs, [{pos: start + j} for j in range(1, k)],
                             feedback={out: tok}, collect=[logits])
        again = eng.run_steps(st.program, v, inputs, [{pos: start + j} for j in range(1, k)],
                              feedback={out: tok}, collect=[logits])  # the captured graph, replayed
        after = eng.read(out, eng.run(st.program, v, {**step, tok: np.array(loop[-2], np.int32), pos: start + k - 1}))
    finally:
        raw(model).give(pages)
    assert [o[out].tolist() for o in outs] == [o[out].tolist() for o in again] == loop
    assert outs[-1][logits].tobytes() == last.tobytes()
    assert after.tolist() == loop[-1]  # single steps after a run_steps see the inputs they write


def test_generate_runs_ahead_by_default_and_gives_the_same_tokens(model):
    """On CUDA, Model.generate runs RUN_AHEAD greedy steps a graph launch by default; the tokens
    are those of one step a launch, and the pool stays consistent."""
    from kern.api import RUN_AHEAD

    assert model.run_ahead == RUN_AHEAD > 1
    prompt = [1, 17, 400, 23, 9, 81, 5]
    ahead = model.generate(prompt, max_tokens=21)
    model.paging.pool.clear()  # no cached prefix: its last rows would come from another program
    model.run_ahead = 1
    try:
        one = model.generate(prompt, max_tokens=21)
    finally:
        model.run_ahead = RUN_AHEAD
    assert ahead.tokens == one.tokens and ahead.finish_reason == one.finish_reason
    model.paging.pool.check()


@pytest.mark.parametrize("path", ["wide", "ragged"])
def test_a_decode_batch_beyond_the_graph_steps_as_rows_alone(model, path):
    """40 sequences (past the gemv decode program's bound) step one row each through the wide
    decode program (a graph of cuBLASLt GEMMs, the path a server's large batches take) or the
    ragged prefill program (cuBLASLt projections, gemv_f32 logits in passes of 32 rows): the
    same tokens as each row through the decode program alone, logits within bf16 GEMM noise."""
    eng, n = model.engine, 40
    st = model.protocol.for_rows(n, 1 if path == "wide" else None)
    assert st.ragged == (path == "ragged") and st.groups_max >= n
    (table,) = st.page_tables
    pages = [raw(model).take(1) for _ in range(n)]  # a lease a sequence, as step_rows steps them
    rng = np.random.default_rng(4)
    ids = rng.integers(0, model.verified.constants["vocab"], n).astype(np.int32)
    pos = np.zeros(n, np.int32)  # each sequence's first row: no earlier K/V to depend on
    pt = np.zeros((n, eng.shapes[table.buffer][1]), np.int32)
    pt[:, 0] = [p[0] for p in pages]
    try:
        inputs = {st.inputs["token"]: ids, st.inputs["position"]: pos, table.buffer: pt}
        if "cu_seqlens" in st.inputs:
            inputs[st.inputs["cu_seqlens"]] = np.arange(n + 1, dtype=np.int32)
        env = eng.run(st.program, st.vars_for(n, n, reach=1), inputs)
        batch_tok, batch_logits = eng.read(st.outputs["tokens"], env), eng.read(st.outputs["logits"], env)
        alone_tok, alone_logits = [], []
        for i in range(n):
            tok, logits = raw(model).step_rows([int(ids[i])], 0, pages[i])
            alone_tok.append(tok)
            alone_logits.append(logits)
    finally:
        for p in pages:
            raw(model).give(p)
    alone = np.stack(alone_logits)
    assert np.isfinite(batch_logits).all()
    close = [bool(batch_tok[i] == alone_tok[i] or np.sort(alone[i])[-1] - np.sort(alone[i])[-2] < 0.05)
             for i in range(n)]
    assert all(close), [i for i, c in enumerate(close) if not c]
    assert np.max(np.abs(batch_logits - alone)) < 0.1 * max(1.0, float(np.max(np.abs(alone))))
