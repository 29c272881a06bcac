"""Batch invariance on the hybrid (docs/determinism.md): a request's bytes on the Kimi-Linear
cpu deployment are a function of the request alone. The property test of the llama family
(tests/generation/test_invariance.py) played on the tiny random Kimi-Linear: random company,
arrival, cached prefix (a checkpoint carries the KDA slot; a shared head leaves a snapshot),
token budget (a prompt cut anywhere, a recurrence resumed mid-prompt), preemption with or
without parking in host memory, run-ahead. Beside it the kernels' own promises: a token's
recurrence and its MLA attention are the same bits in a prompt chunk of any size and in a
decode batch of any size."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kern.api import Model
from tests.generation import test_invariance as llama

from .test_host_loop import prompt


@pytest.fixture(scope="module")
def kimi(kimi_dep, kimi_ckpt):
    model = Model(kimi_dep / "manifest.json", kimi_ckpt, host_bytes=64 << 20)
    return model, [prompt(3, 70), prompt(4, 45)], {}


@st.composite
def scenarios(draw):
    return {**draw(llama.scenarios()), "park": draw(st.booleans())}


@settings(max_examples=20, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(sc=scenarios())
def test_a_request_gets_its_bytes_alone_whatever_its_batch_cache_chunking_and_preemption(kimi, sc):
    got, want = llama.played(kimi, sc)
    assert got == want


# ---- the kernels: a token's bits wherever its prompt was cut and in any decode batch -----------

H, D, CONV = 4, 16, 4  # KDA heads, head width, convolution width
SLOT = (H * D * D + (CONV - 1) * 3 * H * D) * 4  # one KDA layer's slot, bytes
KDA_GEO = (0, 1, H, D, CONV, SLOT)


def _rand(seed: int, *shape) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _kda_inputs(n: int):
    """A sequence's n rows: q | k | v, log decays (<= 0) and beta's logits."""
    return _rand(1, n, 3 * H * D), -np.abs(_rand(2, n, H * D)) * np.float32(0.3), _rand(3, n, H)


def _prefill_cut(kimi_cpu, mix, g, b, cuts: list[int]):
    """The rows fed as prompt chunks ending at each cut (the step's token budget), through the
    cpu deployment's prefill form; the outputs and the slot's state after."""
    state = np.zeros(2 * SLOT, np.uint8)
    o = np.empty((len(mix), H * D), np.float32)
    for lo, hi in zip([0, *cuts], [*cuts, len(mix)]):
        if hi > lo:
            pos = np.arange(lo, hi, dtype=np.int32)
            kimi_cpu.kda_tokens(mix[lo:hi], g[lo:hi], b[lo:hi], state, np.array([1], np.int32),
                                np.array([0, hi - lo], np.int32), pos, o[lo:hi], *KDA_GEO)
    return o, state


@pytest.fixture(scope="module")
def kimi_cpu():
    from kern_models.kimi_linear.kernels.cpu import kernels

    return kernels


@settings(max_examples=20, deadline=None, derandomize=True)
@given(cuts=st.lists(st.integers(1, 36), max_size=4).map(sorted), decoded=st.integers(0, 6),
       batch=st.integers(1, 5), data=st.data())
def test_a_prompt_s_recurrence_has_the_same_bits_cut_anywhere_and_decoded_in_any_batch(kimi_cpu, cuts, decoded,
                                                                                       batch, data):
    """A prompt of 37 rows whole, against the same rows cut at random places, its last rows
    stepped one at a time by decode's kda_step among other sequences' rows (the last prompt
    token after a cache hit, a decode step beside others): the same outputs and state, byte
    for byte."""
    mix, g, b = _kda_inputs(37)
    whole, want = _prefill_cut(kimi_cpu, mix, g, b, [])
    tail = 37 - decoded
    got_o, state = _prefill_cut(kimi_cpu, mix[:tail], g[:tail], b[:tail], [c for c in cuts if c < tail])
    o = np.concatenate([got_o, np.empty((decoded, H * D), np.float32)])
    at = data.draw(st.integers(0, batch - 1))  # its row in each decode step
    slots = np.arange(batch, dtype=np.int32) + 2  # the others' slots, theirs its own
    slots[at] = 1
    state = np.concatenate([state[:2 * SLOT], np.zeros(batch * SLOT, np.uint8)])
    for t in range(tail, 37):
        rows = lambda mine: np.stack([mine if r == at else _rand(10 + r + t, *mine.shape) for r in range(batch)])
        pos = np.full(batch, t, np.int32)
        out = np.empty((batch, H * D), np.float32)
        kimi_cpu.kda_step(rows(mix[t]), rows(g[t]), rows(b[t]), state, slots, pos, out, *KDA_GEO)
        o[t] = out[at]
    assert o.tobytes() == whole.tobytes()
    assert state[SLOT:2 * SLOT].tobytes() == want[SLOT:2 * SLOT].tobytes()


def test_mla_gives_a_row_the_bits_its_role_fixes_wherever_its_prompt_was_cut(kimi_cpu):
    """A prompt row (a position below its sequence's prompt_len) attends in the expanded form
    over exactly its own positions: the same bits whether its prompt came whole or cut in
    chunks, and within rounding of the absorbed form. A generated row fed to prefill again (a
    preempted request recomputed: prompt_len at or below its position) gets decode's bits: the
    absorbed form, as its one-row decode over the same latents gave it."""
    heads, nope, rope, v_dim, lora, page, ctx = 4, 16, 16, 16, 32, 16, 37
    geo = (0, 1, heads, nope, rope, v_dim, lora, page, (lora + rope) * 4)
    kv = np.zeros(4 * page * (lora + rope) * 4, np.uint8)
    table, pos = np.array([[2, 0, 3]], np.int32), np.arange(ctx, dtype=np.int32)
    kimi_cpu.mla_append(_rand(4, ctx, lora + rope), np.ones(lora, np.float32), kv, table, np.array([0, ctx], np.int32),
                        pos, 0, 1, lora, rope, page, (lora + rope) * 4, 1e-6)
    q, kv_b = _rand(5, ctx, heads * (nope + rope)), _rand(6, heads * (nope + v_dim), lora)

    def prefill(cuts, prompt_len):
        out = np.empty((ctx, heads * v_dim), np.float32)
        for lo, hi in zip([0, *cuts], [*cuts, ctx]):
            kimi_cpu.mla_attention(q[lo:hi], kv, table, np.array([0, hi - lo], np.int32), pos[lo:hi],
                                   np.array([prompt_len], np.int32), kv_b, out[lo:hi], *geo)
        return out

    whole = prefill([], ctx)
    assert prefill([20, 21], ctx).tobytes() == whole.tobytes()  # three chunks of one prompt
    assert prefill([1, 2, 3, 17], ctx).tobytes() == whole.tobytes()
    recomputed = prefill([20, 21], 21)  # rows 21.. were generated: recomputed after a preemption
    assert recomputed[:21].tobytes() == whole[:21].tobytes()
    decoded = np.empty((ctx, heads * v_dim), np.float32)
    for p in range(ctx):
        kimi_cpu.mla_attention_decode(q[p:p + 1], kv, table, pos[p:p + 1], kv_b, decoded[p:p + 1], *geo)
    assert recomputed[21:].tobytes() == decoded[21:].tobytes()
    # the prompt rows: the two forms of one sum, within f32 rounding and (but where one key
    # leaves nothing to reorder) not the same bits
    np.testing.assert_allclose(whole[:21], decoded[:21], rtol=1e-4, atol=1e-5)
    assert sum(whole[p].tobytes() != decoded[p].tobytes() for p in range(1, 21)) == 20
