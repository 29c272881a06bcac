"""mla_tc.cu itself on the CPU: its source and attention_tc.cuh compiled with g++ against the host
stand-in of common.cuh (emu/: a block's threads as std::threads, shuffles, ldmatrix and
mma.sync m16n8k16 through per-warp buffers in the PTX fragment layouts; mla_tc_emu.cpp), so the
split's indexing (chunks, partials, the counter, the fold) runs without a GPU, at the smallest
chunk (32 keys, one tile) so short prompts cross several chunks:

- the emulated kernel agrees with the numpy model of the order (mla_tc_model.py) to the bit in
  most outputs and within an f32 ulp or two in the rest (the mma's sum emulated as the model
  takes it; the two differ where glibc's exp2f and numpy's float32 exp2 do);
- a prompt whole, cut anywhere (beside another sequence's rows) and decoded (a block a chunk,
  beside other rows, the blocks run first to last and last to first, so a different block
  folds) gives every row the same bits; the counters are zero again after every launch;
- prefill keeps a row's running output in o_lat: poisoned (NaN) beforehand, nothing leaks;
  decode's grid may hold more chunks than a row has (the step's reach): the extra blocks leave.

What it cannot say: the hardware's own sum of an mma, races between threads the emulator
happens to order (the blocks run one at a time), and speed. Skipped without g++."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from . import mla_tc_model as M
from tests.emu.build import ptr

from .emulate import build_emulator

LAYER = 1
HEADS, NOPE, ROPE, KV_LORA, CHUNK = 20, 16, 16, 32, 32  # 20 heads: two decode head groups, one partial


@pytest.fixture(scope="module")
def emu(tmp_path_factory):
    return build_emulator(tmp_path_factory, "mla_tc_emu", "models/kimi_linear/kernels/cuda/mla_tc.cu", "models/common/cuda/attention_tc.cuh")


class Emu:
    """A paged cache of 3 sequences (72, 40, 24 tokens) and every position's queries; prefill
    and decode launches of the emulated kernels over (sequence, position) picks (a block a row:
    prefill may take any of a sequence's positions)."""

    LENGTHS = [72, 40, 24]

    def __init__(self, lib, seed=0):
        rng = np.random.default_rng(seed)
        self.lib = lib
        self.cache = M.Cache(rng, self.LENGTHS, KV_LORA, ROPE)
        self.q_lat = [(rng.standard_normal((n, HEADS, KV_LORA)) * 0.6).astype(np.float32) for n in self.LENGTHS]
        self.q = [M.bf16_bits((rng.standard_normal((n, HEADS, NOPE + ROPE)) * 0.6).astype(np.float32))
                  for n in self.LENGTHS]

    def _geo(self):
        c = self.cache
        return (LAYER, c.layers, HEADS, NOPE, ROPE, KV_LORA, c.page_tokens, c.token_bytes)

    def _inputs(self, picks):
        q_lat = np.ascontiguousarray(np.stack([self.q_lat[s][p] for s, p in picks]))
        q = np.ascontiguousarray(np.stack([self.q[s][p] for s, p in picks]))
        pos = np.asarray([p for _, p in picks], np.int32)
        o = np.full((len(picks), HEADS, KV_LORA), np.nan, np.float32)
        return q_lat, q, pos, o

    def prefill(self, picks, chunk=CHUNK) -> np.ndarray:
        c = self.cache
        seqs = [s for i, (s, _) in enumerate(picks) if i == 0 or picks[i - 1][0] != s]
        assert len(seqs) == len(set(seqs))
        cu = np.cumsum([0] + [sum(1 for s2, _ in picks if s2 == s) for s in seqs]).astype(np.int32)
        table = np.ascontiguousarray(c.table[seqs])
        q_lat, q, pos, o = self._inputs(picks)
        layer, layers, *rest = self._geo()
        generated = np.zeros(len(seqs), np.int32)  # prompt_len 0: every row a generated token, this kernel's
        self.lib.emu_mla_attend_tc(ptr(q_lat), ptr(q), ptr(c.bits), ptr(table), ptr(cu), ptr(pos), ptr(generated), ptr(o),
                                   *map(ctypes.c_int, (c.pages_per_seq, len(picks), len(seqs), layer, layers, *rest,
                                                       chunk)))
        assert not np.isnan(o).any()
        return o

    def decode(self, picks, chunk=CHUNK, extra=1) -> np.ndarray:
        """One decode launch, its grid holding `extra` chunks more than the longest row needs."""
        c = self.cache
        table = np.ascontiguousarray(c.table[[s for s, _ in picks]])
        q_lat, q, pos, o = self._inputs(picks)
        splits = int(max(-(-(p + 1) // chunk) for _, p in picks)) + extra
        part_o = np.full((len(picks), HEADS, splits, KV_LORA), np.nan, np.float32)
        part_ml = np.full((len(picks), HEADS, splits, 2), np.nan, np.float32)
        sem = np.zeros((len(picks), HEADS), np.int32)
        layer, layers, *rest = self._geo()
        self.lib.emu_mla_attend_tc_decode(ptr(q_lat), ptr(q), ptr(c.bits), ptr(table), ptr(pos), ptr(o), ptr(part_o),
                                          ptr(part_ml), ptr(sem),
                                          *map(ctypes.c_int, (c.pages_per_seq, len(picks), layer, layers, *rest,
                                                              chunk, splits)))
        assert not np.isnan(o).any()
        assert not sem.any(), "a counter not zero again after the launch"
        return o

    def model(self, s, p, chunk=CHUNK) -> np.ndarray:
        keys = self.cache.tokens(s, LAYER, p + 1)
        q_abs = np.concatenate([self.q_lat[s][p], M.from_bits(self.q[s][p, :, NOPE:])], axis=1)
        return M.model_rows(q_abs, lambda i: keys, np.full(HEADS, p + 1), KV_LORA, NOPE, ROPE, chunk=chunk)


@pytest.fixture(scope="module")
def e(emu):
    return Emu(emu)


def test_the_emulated_kernel_matches_the_model(e):
    ps = (0, 31, 32, 33, 63, 64, 71)
    got = e.prefill([(0, p) for p in ps])
    same, worst = [], 0.0
    for j, p in enumerate(ps):
        want = e.model(0, p)
        same.append(np.mean(got[j] == want))
        worst = max(worst, float(np.abs(got[j] - want).max() / max(1.0, np.abs(want).max())))
    assert same[0] == 1.0 and np.mean(same) > 0.5 and worst < 2 ** -21, (same, worst)


def test_a_prompt_whole_cut_or_decoded_gets_the_same_bits(e, emu):
    n = e.LENGTHS[0]
    whole = e.prefill([(0, p) for p in range(n)])
    pieces = []
    for lo, hi in [(0, 1), (1, 30), (30, 33), (33, 64), (64, n)]:  # cuts on and off chunk boundaries
        other = [(1, p) for p in range(10, 10 + (hi - lo) % 3 + 1)]
        pieces.append(e.prefill(other + [(0, p) for p in range(lo, hi)])[len(other):])
    assert np.array_equal(np.concatenate(pieces), whole), "cut prefill != whole prefill"
    rows = [(0, p) for p in (0, 31, 32, 33, 63, 64, n - 1)]
    for order in (0, 1):  # the blocks first to last, then last to first: another block folds
        emu.emu_block_order(order)
        try:
            alone = [e.decode([r])[0] for r in rows[-3:]]
            batch = e.decode([(2, 23), *rows, (1, 39)], extra=2)[1:-1]
        finally:
            emu.emu_block_order(0)
        for j, (_, p) in enumerate(rows):
            assert np.array_equal(batch[j], whole[p]), f"position {p}: decoded in a batch != prefilled"
        for j, (_, p) in enumerate(rows[-3:]):
            assert np.array_equal(alone[j], whole[p]), f"position {p}: decoded alone != prefilled"


def test_one_chunk_is_the_unsplit_order(e):
    """At the deployment's chunk every row here is one chunk: decode writes o_lat at once (no
    partials, the extra blocks leave), prefill's fold of one chunk is exact; the same bits."""
    ps = [0, 11, 23]
    pre = e.prefill([(2, p) for p in ps], chunk=M.CHUNK)
    dec = e.decode([(2, p) for p in ps], chunk=M.CHUNK, extra=3)
    assert np.array_equal(dec, pre)
    # and a chunk of 32 gives rows past it other bits: the chunk is part of the order
    assert not np.array_equal(e.prefill([(0, 71)], chunk=CHUNK), e.prefill([(0, 71)], chunk=M.CHUNK))
