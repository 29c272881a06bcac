"""Engine.run_steps: a decode loop of k steps in one call (the token fed back on the device,
the positions given for every step up front) gives what k single steps give; bad requests are
refused before anything runs."""

from __future__ import annotations

import numpy as np
import pytest

from kern.api import Model, deployment_for
from kern.errors import BoundsError
from kern.drive.raw_pages import raw


def _decode_setup(model: Model, batch: int, prompt: int, new: int):
    """Prefill `batch` random prompts; return (stepper, first inputs, pages)."""
    rng = np.random.default_rng(batch)
    vocab = model.verified.constants["vocab"]
    pages = [raw(model).take(-(-(prompt + new) // model.page_tokens)) for _ in range(batch)]
    first = [raw(model).step_rows(rng.integers(0, vocab, prompt).tolist(), 0, pg, ragged=True)[0] for pg in pages]
    st = model.protocol.for_rows(batch, 1)
    (table,) = st.page_tables
    pt = np.zeros(model.engine.shapes[table.buffer], np.int32)[:batch]
    for i, pg in enumerate(pages):
        pt[i, :len(pg)] = pg
    inputs = {st.inputs["token"]: np.array(first, np.int32), st.inputs["position"]: np.full(batch, prompt, np.int32),
              table.buffer: pt}
    if "cu_seqlens" in st.inputs:
        inputs[st.inputs["cu_seqlens"]] = np.arange(batch + 1, dtype=np.int32)
    return st, inputs, pages


def _loop(model: Model, st, inputs, batch: int, k: int) -> list[list[int]]:
    eng, out, inputs = model.engine, [], dict(inputs)
    for j in range(k):
        env = eng.run(st.program, st.vars_for(batch, batch), inputs)
        out.append(eng.read(st.outputs["tokens"], env).tolist())
        inputs[st.inputs["token"]] = np.array(out[-1], np.int32)
        inputs[st.inputs["position"]] = inputs[st.inputs["position"]] + 1
    return out


@pytest.mark.parametrize("batch", [1, 3])
def test_k_steps_in_one_call_equal_k_single_steps(tiny, batch):
    ckpt, manifest = tiny
    model = Model(manifest, ckpt)
    prompt, k = 5, 6
    st, inputs, pages = _decode_setup(model, batch, prompt, k)
    want = _loop(model, st, inputs, batch, k)
    steps = [{st.inputs["position"]: np.full(batch, prompt + j, np.int32)} for j in range(1, k)]
    outs = model.engine.run_steps(st.program, st.vars_for(batch, batch), inputs, steps,
                                  feedback={st.outputs["tokens"]: st.inputs["token"]}, collect=[])
    assert [o[st.outputs["tokens"]].tolist() for o in outs] == want
    # the fed input ends holding the last step's output, on every device
    assert model.engine.read(st.inputs["token"], model.engine.env(st.program, st.vars_for(batch, batch))).tolist() \
        == want[-1]
    for pg in pages:
        raw(model).give(pg)


def test_bad_run_steps_requests_are_refused_naming_the_problem(tiny):
    ckpt, manifest = tiny
    model = Model(manifest, ckpt)
    st, inputs, pages = _decode_setup(model, 1, 4, 4)
    eng, v = model.engine, st.vars_for(1, 1)
    tok, pos, out = st.inputs["token"], st.inputs["position"], st.outputs["tokens"]
    bad_pos = [{pos: np.array([5], np.int32)}, {pos: np.array([model.context], np.int32)}]
    with pytest.raises(BoundsError, match=rf"input '{pos}' holds values in \[{model.context}, {model.context}\]"):
        eng.run_steps(st.program, v, inputs, bad_pos, feedback={out: tok}, collect=[])
    with pytest.raises(BoundsError, match="every step must write the same ones"):
        eng.run_steps(st.program, v, inputs, [{pos: np.array([5], np.int32)}, {}], feedback={out: tok}, collect=[])
    with pytest.raises(BoundsError, match="is fed back from"):
        eng.run_steps(st.program, v, inputs, [{pos: np.array([5], np.int32)}], feedback={out: pos}, collect=[])
    with pytest.raises(BoundsError, match="not an input"):
        eng.run_steps(st.program, v, inputs, [], feedback={tok: out}, collect=[])
    with pytest.raises(BoundsError, match="no buffer named 'nope'"):
        eng.run_steps(st.program, v, inputs, [], feedback={}, collect=["nope"])
    if "logits" in st.outputs:
        with pytest.raises(BoundsError, match="shapes and dtypes must match"):
            eng.run_steps(st.program, v, inputs, [], feedback={st.outputs["logits"]: tok}, collect=[])
    for pg in pages:
        raw(model).give(pg)


def test_generate_running_ahead_gives_the_same_text_and_keeps_the_pool_right(smollm2):
    """Model.generate with 4 greedy steps a host wait: the same tokens as one step a wait, a
    stop token inside a run ends the request there, the pages written past it go back, and the
    cached prefix holds the right tokens (a later prompt that extends it reuses it and gets
    the same continuation)."""
    manifest = deployment_for(smollm2, "cpu")
    one, four = Model(manifest, smollm2, run_ahead=1), Model(manifest, smollm2, run_ahead=4)
    prompt = one.tokenizer.encode("The three primary colors are")
    want = one.generate(prompt, max_tokens=23)
    got = four.generate(prompt, max_tokens=23)
    assert got.tokens == want.tokens and got.finish_reason == want.finish_reason == "length"
    four.paging.pool.check()
    # a stop token in the middle of a run (token 0 comes from the prefill, runs make 1-4, 5-8, ...)
    first = next(i for i, t in enumerate(want.tokens) if want.tokens.index(t) == i and i > 4 and (i - 1) % 4 == 1)
    stop = want.tokens[first]
    one.loop.eos = four.loop.eos = {stop}
    a, b = one.generate(prompt, max_tokens=23), four.generate(prompt, max_tokens=23)
    assert b.tokens == a.tokens and b.finish_reason == a.finish_reason == "stop" and b.tokens == want.tokens[:first + 1]
    four.paging.pool.check()
    longer = prompt + want.tokens[:first]  # the first request's tokens, a cached prefix now
    four.loop.eos = one.loop.eos = set()
    c, d = four.generate(longer, max_tokens=5), one.generate(longer, max_tokens=5)
    assert c.cached_tokens > len(prompt) and c.tokens == d.tokens == want.tokens[first:first + 5]
    four.paging.pool.check()


def test_run_ahead_must_be_positive(tiny):
    ckpt, manifest = tiny
    with pytest.raises(BoundsError, match="run_ahead must be at least 1"):
        Model(manifest, ckpt, run_ahead=0)


def test_run_ahead_defaults_to_one_where_steps_would_loop(tiny):
    """The CPU device loops run_steps' steps, so running ahead saves nothing: the default is 1."""
    ckpt, manifest = tiny
    assert Model(manifest, ckpt).run_ahead == 1
