"""kda_tc.cu itself on the CPU: its source compiled with g++ against a host stand-in of
common.cuh (emu/: a block's 256 threads as std::threads, shuffles and mma.sync m16n8k16 through
per-warp buffers, the PTX fragment layouts), so its indexing, its slot layout and its two entry
points run without a GPU:

- the emulated kernel agrees with the numpy model of its order (kda_tc_model.py) to the bit in
  almost every output and within an f32 ulp or two in the state (the two differ only where
  glibc's expf and the model's float64 exp, or fma and the model's double rounding, do: with
  libm's expf and fmaf in the model they agreed to the bit at dims 16 to 128);
- a prompt whole, cut anywhere (beside other sequences, through kda_tc) and decoded (through
  kda_tc_decode, beside other rows) gives every token and the slot the same bits;
- a sequence at position 0 reads nothing of its slot (poisoned), and rows past those a chunk
  keeps are never read;
- with the launch's blocks run first to last and last to first: a block reading what another
  block of its launch writes (the groups of value columns share the kept rows' k and gc) would
  get other bits one way (it did, before prefill's first partial chunk got a launch of its own).

What it cannot say: the hardware's own sum of an mma (emulated as the model's), races between
threads the emulator happens to order, and speed. Skipped without g++."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from . import kda_tc_model as M
from tests.emu.build import ptr

from .emulate import build_emulator

LAYERS, LAYER, CONV, SLOTS = 2, 1, 4, 6


@pytest.fixture(scope="module")
def emu(tmp_path_factory):
    return build_emulator(tmp_path_factory, "kda_tc_emu", "models/kimi_linear/kernels/cuda/kda_tc.cu")


class Emu:
    """Sequences' inputs (one set for every head), a state of SLOTS slots (sequence s on slot s)
    poisoned with NaN, and launches of the emulated kernels."""

    def __init__(self, lib, heads: int, dim: int, lengths: list[int], seed: int):
        rng = np.random.default_rng(seed)
        self.lib, self.H, self.D = lib, heads, dim
        self.W = heads * dim
        self.seqs = []
        for n in lengths:
            q, k, v = (M.bf16_round(rng.standard_normal((n, self.W)).astype(np.float32)) for _ in range(3))
            self.seqs.append(dict(mix=np.concatenate([q, k, v], axis=1),
                                  g=(-np.abs(rng.standard_normal((n, self.W))) / 4).astype(np.float32),
                                  b=rng.standard_normal((n, heads)).astype(np.float32)))
        self.per = heads * dim * dim + (CONV - 1) * 3 * self.W
        self.slot_floats = LAYERS * (self.per + 3 * M.C * self.W)
        self.fresh()

    def fresh(self):
        self.state = np.full(SLOTS * self.slot_floats, np.nan, np.float32)

    def _rows(self, parts):
        cat = lambda key: np.ascontiguousarray(np.concatenate([self.seqs[s][key][a:a + n] for s, a, n in parts]))
        mix = (cat("mix").view(np.uint32) >> 16).astype(np.uint16)
        pos = np.concatenate([np.arange(a, a + n) for _, a, n in parts]).astype(np.int32)
        return mix, cat("g"), cat("b"), pos

    def _geo(self):
        return (LAYER, LAYERS, self.H, self.D, CONV, self.slot_floats * 4)

    def prefill(self, parts) -> list[np.ndarray]:
        """kda_tc over (sequence, first row, rows) parts: each part's outputs (f32 of the bf16)."""
        mix, g, b, pos = self._rows(parts)
        o = np.full((len(pos), self.W), 0xFFFF, np.uint16)
        cu = np.cumsum([0] + [n for _, _, n in parts]).astype(np.int32)
        slot = np.array([s for s, _, _ in parts], np.int32)
        self.lib.emu_kda_tc(ptr(mix), ptr(g), ptr(b), ptr(self.state), ptr(slot), ptr(cu), ptr(pos), ptr(o),
                            ctypes.c_int(len(parts)), *map(ctypes.c_int, self._geo()))
        assert not (o == 0xFFFF).any()
        out = (o.astype(np.uint32) << 16).view(np.float32)
        return [out[cu[i]:cu[i + 1]] for i in range(len(parts))]

    def decode(self, rows) -> list[np.ndarray]:
        """kda_tc_decode over (sequence, position) rows: each row's output."""
        mix, g, b, pos = self._rows([(s, r, 1) for s, r in rows])
        o = np.full((len(rows), self.W), 0xFFFF, np.uint16)
        slot = np.array([s for s, _ in rows], np.int32)
        self.lib.emu_kda_tc_decode(ptr(mix), ptr(g), ptr(b), ptr(self.state), ptr(slot), ptr(pos), ptr(o),
                                   ctypes.c_int(len(rows)), *map(ctypes.c_int, self._geo()))
        assert not (o == 0xFFFF).any()
        return list((o.astype(np.uint32) << 16).view(np.float32))

    def slot(self, s: int, n: int) -> list[M.Slot]:
        """Sequence s's slot after n rows, a model Slot a head (rows past n % C zeroed)."""
        C, D, H = M.C, self.D, self.H
        raw = self.state.reshape(SLOTS, -1)[s]
        S = raw[LAYER * self.per:LAYER * self.per + H * D * D].reshape(H, D, D)
        rows = raw[LAYERS * self.per:].reshape(LAYERS, H, 3, C, D)[LAYER]
        out = []
        for h in range(H):
            m = M.Slot(D)
            m.S = S[h].copy()
            for i, name in enumerate(("K", "G", "VN")):
                getattr(m, name)[:n % C] = rows[h, i, :n % C]
            out.append(m)
        return out

    def head(self, s: int, h: int, a: int, b: int) -> tuple:
        x, W, D = self.seqs[s], self.W, self.D
        q, k, v = (x["mix"][a:b, i * W + h * D:i * W + (h + 1) * D] for i in range(3))
        return q, k, v, x["g"][a:b, h * D:(h + 1) * D], x["b"][a:b, h]


def _bits_equal_slots(a: list, b: list, n: int) -> bool:
    t = n % M.C
    return all(np.array_equal(x.S, y.S) and all(np.array_equal(getattr(x, f)[:t], getattr(y, f)[:t])
                                                for f in ("K", "G", "VN")) for x, y in zip(a, b))


# a sequence alone: groups of 16 value columns (grid z; dim 48: three), beside others 32 (dim 48:
# one of 32 and a partial one of 16)
@pytest.mark.parametrize("heads,dim", [(2, 16), (1, 32), (1, 48)])
def test_the_emulated_kernel_matches_the_model(emu, heads, dim):
    e = Emu(emu, heads, dim, [37, 16], seed=dim)
    for s, n in ((0, 37), (1, 16)):
        got = e.prefill([(s, 0, n)])[0].reshape(n, heads, dim)
        slots = e.slot(s, n)
        for h in range(heads):
            m = M.Slot(dim)
            want = M.bf16_round(M.run(m, 0, *e.head(s, h, 0, n)))
            same = np.mean(got[:, h] == want)
            assert same > 0.97, same
            assert np.abs(got[:, h] - want).max() <= 2 ** -7 * np.abs(want).max()
            for f in ("S", "K", "G", "VN"):
                x, y = getattr(slots[h], f), getattr(m, f)
                if f != "S":
                    x, y = x[:n % M.C], y[:n % M.C]
                assert x.size == 0 or np.abs(x - y).max() <= 1e-5 * max(1.0, np.abs(y).max()), f


def test_the_emulated_kernel_for_the_real_head_dim(emu):
    """dim 128: eight groups of 16 value columns (one sequence), the update's eight m tiles (a chunk
    and a half)."""
    e = Emu(emu, 1, 128, [24], seed=3)
    got = e.prefill([(0, 0, 24)])[0]
    want = M.bf16_round(M.run(M.Slot(128), 0, *e.head(0, 0, 0, 24)))
    assert np.abs(got - want).max() <= 2 ** -7 * np.abs(want).max()
    assert np.mean(got == want) > 0.97


# 64: four groups of 16 value columns whole (one sequence), two of 32 where a piece has another
# sequence beside it (48: three of 16, or 32 and a partial 16): the columns never meet, so the
# same bits; order: the launch's blocks from the first, or from the last
@pytest.mark.parametrize("heads,dim,order", [(2, 16, 0), (1, 64, 0), (1, 64, 1), (1, 48, 1)])
def test_whole_cut_and_decoded_give_the_same_bits(emu, heads, dim, order):
    emu.emu_block_order(order)
    e = Emu(emu, heads, dim, [40, 23, 9], seed=5)
    n = 40
    whole = e.prefill([(0, 0, n)])[0]
    want = e.slot(0, n)
    # cut at 7, 16 and 29, each piece beside another sequence's rows (the others start fresh)
    e.fresh()
    pieces = []
    for (a, b), other in zip([(0, 7), (7, 16), (16, 29), (29, 40)], [(1, 0, 5), (2, 0, 9), (1, 5, 18), None]):
        parts = ([other] if other else []) + [(0, a, b - a)]
        pieces.append(e.prefill(parts)[-1])
    assert np.array_equal(np.concatenate(pieces), whole)
    assert _bits_equal_slots(e.slot(0, n), want, n)
    # 13 rows in prefill, then each row decoded at a shifting place in a batch with sequence 1
    e.fresh()
    got = [e.prefill([(0, 0, 13)])[0]]
    e.prefill([(1, 0, 3)])
    for i, r in enumerate(range(13, n)):
        batch = [(1, 3 + i)] if i < 20 else []
        at = i % 2 if batch else 0
        batch.insert(at, (0, r))
        got.append(e.decode(batch)[at][None])
    assert np.array_equal(np.concatenate(got), whole)
    assert _bits_equal_slots(e.slot(0, n), want, n)
