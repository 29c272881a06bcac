"""KDA's recurrence in chunks fixed by position on tensor cores (kda_tc.cu: kda_tc for prefill,
kda_tc_decode for decode) on the GPU, against numbers (the bits whole / cut anywhere / decoded
and alone / beside others are test_cuda_gpu_invariant.py's, which runs this form and the tokens
one through the same checks):

1. against a float64 token-by-token recurrence (kda_tc_model.reference) of every head: within
   the bf16 rounding of the output the kernel writes, and the state the slot holds (the chunk's
   start state and its rows kept) within f32's;
2. against the numpy model of the kernel's order (kda_tc_model.run): within the bf16 rounding
   of the output (the model cannot know the mma's own sum nor expf's last ulp);
3. against the tokens form (kda_tokens, kda_step), the same inputs: within the same rounding;
4. a decode of the chunk's last row moves the state on: the slot's start state then equals the
   whole prompt's.

The real head (dim 128, 4 of its 32 heads), a half one and the tiny model's (dim 16).

    python -m pytest -q tests/kimi_linear/test_cuda_gpu_kda_tc.py   (on the H200; seconds)"""

from __future__ import annotations

import numpy as np
import pytest

from . import kda_tc_model as M

pytestmark = pytest.mark.gpu
SHAPES = [(4, 128), (3, 64), (2, 16)]
LENGTHS = [150, 33, 16, 7]


def _kda(gpu, form: str, heads: int, dim: int):
    from kern_models.kimi_linear.kernels.cuda import table
    from .test_cuda_gpu_invariant import Kda

    return Kda(gpu, table.ops(form), heads, dim, LENGTHS, seed=dim + heads)


def _f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _head_inputs(kda, s: int, h: int) -> tuple:
    """Sequence s's rows of head h: q, k, v (bf16 values), g, b."""
    x = kda.seqs[s]
    W, D = kda.W, kda.dim
    mix = _f32(x["mix"])
    q, k, v = (mix[:, i * W + h * D:i * W + (h + 1) * D] for i in range(3))
    return q, k, v, x["g"][:, h * D:(h + 1) * D], x["b"][:, h]


def _slot_state(kda, s: int, n: int) -> np.ndarray:
    """The state after sequence s's first n rows, float64, from what kda_tc's slot keeps: S0
    decayed to the last kept row plus the kept rows' updates, [heads, dim, dim]."""
    from .test_cuda_gpu_invariant import CONV, LAYER, LAYERS

    D, H, C = kda.dim, kda.heads, M.C
    per = H * D * D + (CONV - 1) * 3 * kda.W
    slot = kda.gpu.get(kda.state, np.float32, (8, kda.slot_bytes // 4))[s]
    S = slot[LAYER * per:LAYER * per + H * D * D].reshape(H, D, D)
    rows = slot[LAYERS * per:].reshape(LAYERS, H, 3, C, D)[LAYER]
    out = []
    for h in range(H):
        m = M.Slot(D)
        m.S, m.K, m.G, m.VN = S[h], rows[h, 0], rows[h, 1], rows[h, 2]
        out.append(M.state_after(m, n, D))
    return np.stack(out)


@pytest.mark.parametrize("heads,dim", SHAPES)
def test_kda_tc_matches_float64_the_model_and_the_tokens_form(gpu, heads, dim):
    tc, tokens = _kda(gpu, "tc", heads, dim), _kda(gpu, "tokens", heads, dim)
    worst = {"float64": 0.0, "model": 0.0, "tokens": 0.0, "state": 0.0}
    for s, n in enumerate(LENGTHS):
        tc.fresh()
        tokens.fresh()
        got = _f32(tc.prefill([(s, 0, n)])[0]).reshape(n, heads, dim)
        old = _f32(tokens.prefill([(s, 0, n)])[0]).reshape(n, heads, dim)
        state = _slot_state(tc, s, n)
        for h in range(heads):
            x = _head_inputs(tc, s, h)
            want, S = M.reference(*x)
            scale = np.abs(want).max()
            model = M.bf16_round(M.run(M.Slot(dim), 0, *x))
            worst["float64"] = max(worst["float64"], np.abs(got[:, h] - want).max() / scale)
            worst["model"] = max(worst["model"], np.abs(got[:, h] - model).max() / scale)
            worst["tokens"] = max(worst["tokens"], np.abs(got[:, h] - old[:, h]).max() / scale)
            worst["state"] = max(worst["state"], np.abs(state[h] - S).max() / np.abs(S).max())
    print(f"heads {heads} dim {dim}: worst |err| / max|o| {worst}")
    # the output is bf16 (8 significant bits): rounded, a value is off by at most 2^-8 of itself,
    # so by at most 2^-8 (3.9e-3) of the largest, plus what the arithmetic adds (~1e-5); two outputs
    # rounded each (the model's and the tokens form's) differ by up to one unit, 2^-7
    assert worst["float64"] < 5e-3 and worst["model"] < 9e-3 and worst["tokens"] < 9e-3, worst
    # the state stays in f32 (products on split bf16, ~2^-17 an operand)
    assert worst["state"] < 1e-4, worst


@pytest.mark.parametrize("heads,dim", SHAPES)
def test_a_decode_that_ends_the_chunk_moves_the_start_state_on(gpu, heads, dim):
    """Sequence 0's first 31 rows in prefill, row 31 (a chunk's last) decoded: the slot's start
    state is then the one a prefill of 32 rows leaves, to the bit."""
    from .test_cuda_gpu_invariant import CONV, LAYER

    kda = _kda(gpu, "tc", heads, dim)
    per = heads * dim * dim + (CONV - 1) * 3 * kda.W

    def start_state():
        slot = kda.gpu.get(kda.state, np.uint32, (8, kda.slot_bytes // 4))[0]
        return slot[LAYER * per:LAYER * per + heads * dim * dim].copy()

    kda.fresh()
    whole = kda.prefill([(0, 0, 32)])[0]
    want = start_state()
    kda.fresh()
    head = kda.prefill([(0, 0, 31)])[0]
    last = kda.decode([(0, 31)])[0]
    assert np.array_equal(np.concatenate([head, last[None]]), whole)
    assert np.array_equal(start_state(), want)
