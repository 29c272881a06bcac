"""KDA's short convolution (kda_conv.cuh: kda_conv over a prompt's rows, kda_conv_decode over
one row a sequence) compiled for the CPU with g++ against the host stand-in of common.cuh (emu/),
so its tiling, its in-place rewrite and its window in the slot run without a GPU:

- a prompt whole, cut anywhere (its later parts reading the window the earlier left in the
  slot, beside other sequences) and decoded a token at a time give every token and the window
  the same bits: the tile a row falls in never changes its arithmetic;
- the outputs are silu of the causal convolution (numpy, float64) within f32 rounding and the
  window holds the last conv - 1 inputs;
- a sequence at position 0 reads nothing of its slot (poisoned with NaN), and a launch's
  blocks run first to last or last to first give the same bits (no block reads what another
  writes).

What it cannot say: races between threads the emulator happens to order, and speed. Skipped
without g++."""

from __future__ import annotations

import numpy as np
import pytest

from tests.emu.build import ptr

from .emulate import build_emulator

LAYERS, LAYER, SLOTS = 2, 1, 5


@pytest.fixture(scope="module")
def emu(tmp_path_factory):
    return build_emulator(tmp_path_factory, "kda_conv_emu", "models/kimi_linear/kernels/cuda/kda_conv.cuh")


def bf16(a: np.ndarray) -> np.ndarray:
    """float32 -> the bf16 bits (round to nearest even), as uint16."""
    u = np.ascontiguousarray(a, np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


class Conv:
    """Sequences' inputs (sequence s on slot s), a state of SLOTS slots poisoned with NaN, and
    launches of the emulated kernels over parts (sequence, first row, rows)."""

    def __init__(self, lib, heads: int, dim: int, conv: int, lengths: list[int], seed: int):
        rng = np.random.default_rng(seed)
        self.lib, self.H, self.D, self.K = lib, heads, dim, conv
        self.C = 3 * heads * dim
        self.w = bf16(rng.standard_normal((self.C, conv)).astype(np.float32) / 2)
        self.x = [bf16(rng.standard_normal((n, self.C)).astype(np.float32)) for n in lengths]
        self.per = heads * dim * dim + (conv - 1) * self.C
        self.slot_floats = LAYERS * self.per + 7  # a slot's bytes need not be the layers' alone
        self.state = np.full(SLOTS * self.slot_floats, np.nan, np.float32)

    def geo(self):
        return LAYER, LAYERS, self.H, self.D, self.K, self.slot_floats * 4

    def prefill(self, parts) -> list[np.ndarray]:
        mix = np.ascontiguousarray(np.concatenate([self.x[s][a:a + n] for s, a, n in parts]))
        cu = np.cumsum([0] + [n for _, _, n in parts]).astype(np.int32)
        pos = np.concatenate([np.arange(a, a + n) for _, a, n in parts]).astype(np.int32)
        slot = np.array([s for s, _, _ in parts], np.int32)
        self.lib.emu_kda_conv(ptr(mix), ptr(self.w), ptr(self.state), ptr(slot), ptr(cu), ptr(pos), len(parts),
                              *self.geo())
        return [mix[cu[i]:cu[i + 1]] for i in range(len(parts))]

    def decode(self, rows) -> np.ndarray:
        """One row each of (sequence, position)."""
        mix = np.ascontiguousarray(np.stack([self.x[s][p] for s, p in rows]))
        pos = np.array([p for _, p in rows], np.int32)
        slot = np.array([s for s, _ in rows], np.int32)
        self.lib.emu_kda_conv_decode(ptr(mix), ptr(self.w), ptr(self.state), ptr(slot), ptr(pos), len(rows),
                                     *self.geo())
        return mix

    def window(self, s: int) -> np.ndarray:
        base = s * self.slot_floats + LAYER * self.per + self.H * self.D * self.D
        return self.state[base:base + (self.K - 1) * self.C].reshape(self.K - 1, self.C)


def reference(x_bits: np.ndarray, w_bits: np.ndarray) -> np.ndarray:
    """silu of the causal convolution of one fresh sequence, float64."""
    x, w = f32(x_bits).astype(np.float64), f32(w_bits).astype(np.float64)
    n, k = len(x), w.shape[1]
    ext = np.concatenate([np.zeros((k - 1, x.shape[1])), x])
    acc = sum(ext[j:j + n] * w[:, j] for j in range(k))
    return acc / (1 + np.exp(-acc))


SHAPES = [(2, 16, 4), (3, 64, 4), (1, 32, 2), (2, 16, 1)]  # heads, dim, conv (C past 128: several blocks)


@pytest.mark.parametrize("heads,dim,conv", SHAPES)
def test_whole_cut_and_decoded_agree_to_the_bit(emu, heads, dim, conv):
    lengths = [37, 1, 16, 17]
    whole = Conv(emu, heads, dim, conv, lengths, seed=heads * 100 + dim + conv)
    outs = whole.prefill([(s, 0, n) for s, n in enumerate(lengths)])
    for s, n in enumerate(lengths):
        got = f32(outs[s]).astype(np.float64)
        want = reference(whole.x[s], whole.w)
        np.testing.assert_allclose(got, want, rtol=2 ** -7, atol=1e-6)  # bf16 outputs
        if conv > 1:  # the last conv - 1 inputs, zeros before the first
            padded = np.concatenate([np.zeros((conv - 1, whole.C), np.float32), f32(whole.x[s])])
            np.testing.assert_array_equal(whole.window(s), padded[-(conv - 1):])

    cut = Conv(emu, heads, dim, conv, lengths, seed=heads * 100 + dim + conv)
    # sequence 0 in parts of 5, 16 (a whole tile) and 16 beside the others' first rows and rest
    pieces = [cut.prefill([(0, 0, 5), (2, 0, 3), (3, 0, 17)]), cut.prefill([(1, 0, 1), (0, 5, 16), (2, 3, 13)]),
              cut.prefill([(0, 21, 16)])]
    np.testing.assert_array_equal(np.concatenate([pieces[0][0], pieces[1][1], pieces[2][0]]), outs[0])
    np.testing.assert_array_equal(np.concatenate([pieces[0][1], pieces[1][2]]), outs[2])
    np.testing.assert_array_equal(pieces[0][2], outs[3])
    np.testing.assert_array_equal(pieces[1][0], outs[1])

    dec = Conv(emu, heads, dim, conv, lengths, seed=heads * 100 + dim + conv)
    first = dec.prefill([(0, 0, 9)])[0]  # then token by token beside sequence 3's
    rows = [dec.decode([(0, p), (3, p)] if p < 17 else [(0, p)]) for p in range(9, 37)]
    for p, got in zip(range(9, 37), rows):
        np.testing.assert_array_equal(got[0], outs[0][p])
    np.testing.assert_array_equal(first, outs[0][:9])
    if conv > 1:
        for s in (0, 2, 3):
            np.testing.assert_array_equal(cut.window(s), whole.window(s))
        np.testing.assert_array_equal(dec.window(0), whole.window(0))


def test_block_order_does_not_matter(emu):
    lengths = [40, 23]
    a = Conv(emu, 3, 64, 4, lengths, seed=7)
    b = Conv(emu, 3, 64, 4, lengths, seed=7)
    emu.emu_block_order(1)
    try:
        ob = b.prefill([(0, 0, 40), (1, 0, 23)])
    finally:
        emu.emu_block_order(0)
    oa = a.prefill([(0, 0, 40), (1, 0, 23)])
    for x, y in zip(oa, ob):
        np.testing.assert_array_equal(x, y)
