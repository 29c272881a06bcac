"""mla_tc.cu's mla_attend_x_wg (mla_attend_x's order on wgmma: two consumer warpgroups, a producer
warpgroup, mbarriers) on the CPU, compiled with g++ against the emulator of test_mla_x_emulated.py
and the wgmma stand-ins beside it (emu/wgmma.cuh, emu/mla_wg.cuh: mbarriers as counted phases, the
RS form's A from the warp's registers in the PTX fragment layout, B where the kernel's descriptor
says the hardware reads it, 128-byte swizzled, K-major or N-major):

- a prompt row gets the attention float64 gives it (within bf16's rounding of P), at the tiny
  shape (v_dim 24: V's dims past it zero) and at Kimi's (nope 128, rope 64, v_dim 128: every K
  block, both V atoms, so the descriptors' LBO and SBO), over prompts of several 128-row tiles;
- the same bits as mla_attend_x's emulation, row for row (a k16 step sums alike through both
  emulations, as on the hardware, wgmma.cuh; the order is the same op for op);
- a prompt whole, cut anywhere (beside other sequences' rows, generated rows in the step), and
  with every block of the grid run first to last or last to first: the same bits a row; a
  generated row is never written.

What this cannot say: the hardware's own reading of the descriptors and the fragment layouts
(the emulator is this file's reading of the PTX manual), wgmma's and the mbarriers' timing, races
the emulator happens to order, registers, speed: test_cuda_gpu_mla_x.py on a GPU. Skipped
without g++."""

from __future__ import annotations

import numpy as np
import pytest

from .test_mla_x_emulated import LENGTHS, Prompts, emu  # noqa: F401  (emu: the module's emulator fixture)

WG = "emu_mla_attend_x_wg"


@pytest.fixture(scope="module")
def P(emu):  # noqa: F811
    return Prompts(emu)


@pytest.fixture(scope="module")
def kimi(emu):  # noqa: F811
    """Kimi's head shape, two heads; a prompt of 200 rows (two 128-row tiles) and one of 40."""
    return Prompts(emu, seed=1, lengths=[200, 40], heads=2, nope=128, rope=64, v_dim=128, kv_lora=32)


def _against_float64(P, o, rows):
    worst = 0.0
    for j, (s, p) in enumerate(rows):
        worst = max(worst, float(np.abs(o[j] - P.reference(s, p)).max()))
    return worst


def test_a_prompt_row_gets_float64_s_attention_and_a_generated_row_nothing(P):
    o, *_ = P.step([(2, 0, 24, 24), (1, 30, 10, 35)], entry=WG)
    rows = [(2, p) for p in range(24)] + [(1, p) for p in range(30, 35)]
    assert np.isnan(o[24 + 5:]).all(), "a generated row written"
    assert not np.isnan(o[:24 + 5]).any()
    worst = _against_float64(P, np.concatenate([o[:24], o[24:29]]), rows)
    assert worst < 2e-2, worst  # P and o rounded to bf16 (values of scale 1)


def test_kimi_s_shape_over_several_tiles_gets_float64_s_attention(kimi):
    # sequence 0's rows 0 .. 199 (two tiles: the second's warpgroups see keys to 199), sequence 1's
    # rows 8 .. 39 of a 40-token prompt beside them
    o, *_ = kimi.step([(1, 8, 32, 40), (0, 0, 200, 200)], entry=WG)
    assert not np.isnan(o).any()
    rows = [(1, p) for p in range(8, 40)] + [(0, p) for p in range(200)]
    pick = list(range(0, 32, 5)) + [32 + p for p in (0, 1, 63, 64, 127, 128, 150, 199)]
    worst = _against_float64(kimi, o[pick], [rows[i] for i in pick])
    assert worst < 2e-2, worst


def test_the_same_bits_as_mla_attend_x(P, kimi):
    for prompts, seqs in ((P, [(0, 0, 72, 72), (1, 30, 10, 35), (2, 3, 21, 24)]),
                          (kimi, [(1, 8, 32, 40), (0, 0, 200, 200)])):
        want, *_ = prompts.step(seqs)
        got, *_ = prompts.step(seqs, entry=WG)
        assert np.array_equal(np.isnan(got), np.isnan(want))
        assert np.array_equal(got[~np.isnan(got)], want[~np.isnan(want)]), "mla_attend_x_wg's bits differ from mla_attend_x's"


def test_a_prompt_whole_cut_or_beside_others_gets_the_same_bits(P):
    n = LENGTHS[0]
    whole, *_ = P.step([(0, 0, n, n)], entry=WG)
    assert not np.isnan(whole).any()
    pieces = []
    for i, (lo, hi) in enumerate([(0, 1), (1, 30), (30, 33), (33, 64), (64, n)]):  # on and off tile boundaries
        other = [(1, 10 + i, 1 + i % 3, 12), (2, 0, 5, 24)]  # a sequence's generated rows, another's prompt rows
        o, *_ = P.step(other + [(0, lo, hi - lo, n)], block_order=i % 2, entry=WG)
        pieces.append(o[sum(r for _, _, r, _ in other):])
    assert np.array_equal(np.concatenate(pieces), whole), "a cut prompt's rows differ from the whole prompt's"
    # the same rows as the generated tail of a shorter prompt's step: its prompt rows alone written, the same bits
    o, *_ = P.step([(0, 40, 32, 50)], block_order=1, entry=WG)
    assert np.array_equal(o[:10], whole[40:50]) and np.isnan(o[10:]).all()


def test_kimi_s_shape_cut_across_a_tile_in_either_block_order(kimi):
    whole, *_ = kimi.step([(0, 0, 200, 200)], entry=WG)
    for order in (0, 1):
        a, *_ = kimi.step([(1, 0, 40, 40), (0, 0, 131, 200)], block_order=order, entry=WG)
        b, *_ = kimi.step([(0, 131, 69, 200), (1, 0, 3, 40)], block_order=1 - order, entry=WG)
        assert np.array_equal(np.concatenate([a[40:], b[:69]]), whole)
