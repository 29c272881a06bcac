"""The numpy model of kda_tc.cu's order (kda_tc_model.py), on the CPU: a prompt cut anywhere,
decoded token by token, or both, gives every token the bits of the whole prompt, and the same
state (the chunk's start state and the rows kept); the model agrees with a float64 token-by-token
recurrence and with the cpu reference's kda_tokens (kernels/cpu/kernels.py) within a tolerance
(below). The kernel's bits on the H200 are the GPU tests' to check (test_cuda_gpu_kda_tc.py).

The tolerance: the model's products run on split bf16 operands (hi + lo: about 16 bits of
mantissa, relative error ~2^-17 a product) with f32 accumulation, the rest in f32, so against
float64 it lands where an f32 recurrence does: a few 1e-6 of the output's scale over a few
chunks. The bound asked, 2e-4 x max|o|, is 30-100x what it measures (printed with -s) and
far below the bf16 rounding of the output the kernel writes (2^-9 = 2e-3 relative), which is
what kern test's floor for the op is made of (docs/kern-test.md: 16 x the reference's error
in the candidate's precision)."""

from __future__ import annotations

import numpy as np
import pytest

from . import kda_tc_model as M


def _whole(x, D):
    slot = M.Slot(D)
    return M.run(slot, 0, *x), slot


def _cut(x, D, cuts):
    """The prompt in pieces at `cuts` (positions), each call continuing from the slot."""
    slot = M.Slot(D)
    edges = [0, *cuts, len(x[0])]
    outs = [M.run(slot, a, *(y[a:b] for y in x)) for a, b in zip(edges, edges[1:]) if b > a]
    return np.concatenate(outs), slot


def _same_slot(a: M.Slot, b: M.Slot, pos: int):
    n = pos % M.C
    assert np.array_equal(a.S, b.S)
    for x, y in ((a.K, b.K), (a.G, b.G), (a.VN, b.VN)):
        assert np.array_equal(x[:n], y[:n])


@pytest.mark.parametrize("D", [16, 32])
def test_a_prompt_cut_anywhere_gives_the_whole_prompts_bits(D):
    x = M.inputs(np.random.default_rng(D), 45, D)
    want, slot = _whole(x, D)
    for cuts in ([1], [7], [15], [16], [17], [31, 32], [3, 20, 21, 40], [5, 10, 15, 44]):
        got, s = _cut(x, D, cuts)
        assert np.array_equal(got, want), cuts
        _same_slot(s, slot, 45)
    # a prefix alone gets the whole prompt's first bits, and continuing from its slot the rest
    for n in (16, 20, 33):
        head, s = _whole(tuple(y[:n] for y in x), D)
        assert np.array_equal(head, want[:n])
        assert np.array_equal(M.run(s, n, *(y[n:] for y in x)), want[n:])
        _same_slot(s, slot, 45)


@pytest.mark.parametrize("D", [16, 32])
def test_decode_token_by_token_gives_the_whole_prompts_bits(D):
    x = M.inputs(np.random.default_rng(1 + D), 37, D)
    want, slot = _whole(x, D)
    got, s = _cut(x, D, list(range(1, 37)))
    assert np.array_equal(got, want)
    _same_slot(s, slot, 37)
    # a prefill of 9, then decode
    got, s = _cut(x, D, [9, *range(10, 37)])
    assert np.array_equal(got, want)
    _same_slot(s, slot, 37)


def test_random_cuts():
    D, n = 16, 70
    x = M.inputs(np.random.default_rng(5), n, D, decay=3.0)
    want, slot = _whole(x, D)
    rng = np.random.default_rng(9)
    for _ in range(6):
        cuts = sorted(set(rng.integers(1, n, size=rng.integers(1, 8)).tolist()))
        got, s = _cut(x, D, cuts)
        assert np.array_equal(got, want), cuts
        _same_slot(s, slot, n)


@pytest.mark.parametrize("D,n,decay", [(16, 50, 1.0), (32, 40, 4.0), (64, 33, 0.2), (128, 20, 1.0)])
def test_the_model_matches_float64_within_f32_rounding(D, n, decay):
    x = M.inputs(np.random.default_rng(D + n), n, D, decay)
    got, slot = _whole(x, D)
    want, S = M.reference(*x)
    err = np.abs(got - want).max() / np.abs(want).max()
    serr = np.abs(M.state_after(slot, n, D) - S).max() / np.abs(S).max()
    print(f"D {D} n {n} decay {decay}: output rel err {err:.2e}, state {serr:.2e}")
    assert err < 2e-4 and serr < 2e-4


def test_only_the_split_makes_it_f32_like():
    """Without the lo parts (plain bf16 operands) the error is bf16's: the split is what keeps
    the products within the f32 recurrence's tolerance."""
    D, n = 32, 48
    x = M.inputs(np.random.default_rng(3), n, D)
    want, _ = M.reference(*x)
    got, _ = _whole(x, D)
    split = M.split
    try:
        M.split = lambda a: (M.bf16_round(np.asarray(a, np.float32)), np.zeros_like(np.asarray(a, np.float32)))
        plain, _ = _whole(x, D)
    finally:
        M.split = split
    scale = np.abs(want).max()
    assert np.abs(got - want).max() / scale * 20 < np.abs(plain - want).max() / scale


def test_the_model_agrees_with_the_cpu_reference():
    """kernels/cpu/kernels.py kda_tokens (the cpu deployment's prefill, f32) over one head of
    one sequence, layers 1: the same outputs within f32 rounding, and its
    state equal to the model's within it."""
    from kern_models.kimi_linear.kernels.cpu import kernels as K

    D, n = 32, 41
    q, k, v, g, b = M.inputs(np.random.default_rng(11), n, D, decay=2.0)
    mix = np.concatenate([q, k, v], axis=1).astype(np.float32)
    slot_bytes = (D * D + 3 * D) * 4  # the state and a window of one row (conv 2, unused here)
    state = np.zeros(slot_bytes, np.uint8)
    o = np.zeros((n, D), np.float32)
    K.kda_tokens(mix, g.copy(), b[:, None].copy(), state, np.array([0]), np.array([0, n]), np.arange(n), o,
                 0, 1, 1, D, 2, slot_bytes)
    got, slot = _whole((q, k, v, g, b), D)
    scale = np.abs(o).max()
    assert np.abs(got - o).max() / scale < 2e-4
    S = state.view(np.float32)[:D * D].reshape(D, D)
    assert np.abs(M.state_after(slot, n, D) - S).max() / np.abs(S).max() < 2e-4


def test_rows_not_yet_computed_do_not_reach_a_row():
    """Garbage in the slot's rows past those kept (a row kept by an earlier chunk) changes
    nothing: a call reads only rows < t0 of its chunk."""
    D = 16
    x = M.inputs(np.random.default_rng(2), 24, D)
    slot = M.Slot(D)
    a = M.run(slot, 0, *(y[:20] for y in x))
    dirty = slot.copy()
    dirty.K[4:], dirty.G[4:], dirty.VN[4:] = 1e30, -1e30, np.nan
    b1 = M.run(slot, 20, *(y[20:] for y in x))
    b2 = M.run(dirty, 20, *(y[20:] for y in x))
    assert np.array_equal(b1, b2) and np.array_equal(a, _whole(x, D)[0][:20])
