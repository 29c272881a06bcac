"""mla_tc.cu's expanded form of a prompt's rows on the CPU (mla_keys, mla_gather, mla_attend_x),
compiled with g++ against the emulator of test_mla_tc_emulated.py (emu/mla_tc_emu.cpp: a
block's threads as std::threads, ldmatrix and mma.sync through the PTX fragment layouts):

- mla_keys numbers the keys each sequence's prompt rows need (0 .. its last prompt row), none
  for a sequence whose rows are all generated; mla_gather copies exactly their latents;
- mla_attend_x gives a prompt row the attention float64 gives it (within bf16's rounding of
  P), writes every prompt row and no generated one (their o stays poisoned: the absorbed path's);
- a prompt whole, cut anywhere (beside other sequences' rows, generated rows in the step), and
  with every block of the grid run first to last or last to first: the same bits a row.

The keys' expansion (kx) is the invariant GEMM's in the deployment; here each key's expanded
row is a fixed random one, the same whatever step holds it, as the GEMM's is. What this cannot
say: the hardware's own mma sums, races the emulator happens to order, speed. Skipped without g++."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from . import mla_tc_model as M
from tests.emu.build import ptr

from .emulate import build_emulator

LAYER = 1
HEADS, NOPE, ROPE, V_DIM, KV_LORA = 3, 16, 16, 24, 32  # v_dim 24: the tiles past it zero, never stored
LENGTHS = [72, 40, 24]


@pytest.fixture(scope="module")
def emu(tmp_path_factory):
    return build_emulator(tmp_path_factory, "mla_tc_emu", "models/kimi_linear/kernels/cuda/mla_tc.cu",
                          "models/common/cuda/attention_tc.cuh")


class Prompts:
    """A paged cache of sequences of the given lengths (three by default), every position's query
    and every key's expanded row, at the given shape (the module's tiny one by default)."""

    def __init__(self, lib, seed=0, lengths=LENGTHS, heads=HEADS, nope=NOPE, rope=ROPE, v_dim=V_DIM, kv_lora=KV_LORA):
        rng = np.random.default_rng(seed)
        self.lib = lib
        self.heads, self.nope, self.rope, self.v_dim, self.kv_lora = heads, nope, rope, v_dim, kv_lora
        self.cache = M.Cache(rng, lengths, kv_lora, rope)
        self.q = [M.bf16_bits((rng.standard_normal((n, heads, nope + rope)) * 0.5).astype(np.float32)) for n in lengths]
        self.kx = [M.bf16_bits(rng.standard_normal((n, heads, nope + v_dim)).astype(np.float32)) for n in lengths]

    def step(self, seqs, block_order=0, entry="emu_mla_attend_x"):
        """One prefill step: seqs = [(sequence, first position, rows, prompt_len)]. Returns o
        [rows, heads, v_dim] (f32 of the bf16 written; NaN where the kernel wrote nothing), koff
        and lat. entry: the emulated attention kernel (mla_attend_x or its wgmma twin)."""
        c, lib = self.cache, self.lib
        HEADS, NOPE, ROPE, V_DIM, KV_LORA = self.heads, self.nope, self.rope, self.v_dim, self.kv_lora
        cu = np.cumsum([0] + [n for _, _, n, _ in seqs]).astype(np.int32)
        pos = np.concatenate([np.arange(p, p + n) for _, p, n, _ in seqs]).astype(np.int32)
        plen = np.asarray([pl for *_, pl in seqs], np.int32)
        table = np.ascontiguousarray(c.table[[s for s, *_ in seqs]])
        rows = int(cu[-1])
        koff = np.full(len(seqs) + 1, -1, np.int32)
        lib.emu_mla_keys(ptr(cu), ptr(pos), ptr(plen), ptr(koff), ctypes.c_int(len(seqs)))
        keys = max(1, int(koff[-1]))
        lat = np.full((keys, KV_LORA), 0xFFFF, np.uint16)
        geo = (LAYER, c.layers, KV_LORA, ROPE, c.page_tokens, c.token_bytes)
        lib.emu_mla_gather(ptr(c.bits), ptr(table), ptr(koff), ptr(lat),
                           *map(ctypes.c_int, (c.pages_per_seq, len(seqs), keys, *geo)))
        kx = np.zeros((keys, HEADS * (NOPE + V_DIM)), np.uint16)
        for i, (s, *_) in enumerate(seqs):
            for t in range(koff[i + 1] - koff[i]):
                kx[koff[i] + t] = self.kx[s][t].reshape(-1)
        q = np.ascontiguousarray(np.concatenate([self.q[s][p:p + n] for s, p, n, _ in seqs]))
        o = np.full((rows, HEADS, V_DIM), 0x7FC0, np.uint16)  # NaN: what no launch wrote
        lib.emu_block_order(block_order)
        try:
            getattr(lib, entry)(ptr(q), ptr(c.bits), ptr(table), ptr(cu), ptr(pos), ptr(plen), ptr(koff), ptr(kx), ptr(o),
                                *map(ctypes.c_int, (c.pages_per_seq, rows, len(seqs), keys, LAYER, c.layers, HEADS, NOPE,
                                                    ROPE, KV_LORA, V_DIM, c.page_tokens, c.token_bytes)))
        finally:
            lib.emu_block_order(0)
        return M.from_bits(o), koff, lat

    def reference(self, s, p) -> np.ndarray:
        """float64 attention of (s, p) over its keys 0 .. p: [heads, v_dim]."""
        HEADS, NOPE, ROPE, V_DIM, KV_LORA = self.heads, self.nope, self.rope, self.v_dim, self.kv_lora
        q = M.from_bits(self.q[s][p]).astype(np.float64)
        kx = M.from_bits(self.kx[s][:p + 1]).astype(np.float64)
        rope = self.cache.tokens(s, LAYER, p + 1)[:, KV_LORA:].astype(np.float64)
        out = np.empty((HEADS, V_DIM))
        for h in range(HEADS):
            k = np.concatenate([kx[:, h, :NOPE], rope], axis=1)
            sc = k @ q[h] / np.sqrt(NOPE + ROPE)
            w = np.exp(sc - sc.max())
            out[h] = (w / w.sum()) @ kx[:, h, NOPE:]
        return out


@pytest.fixture(scope="module")
def P(emu):
    return Prompts(emu)


def test_keys_are_numbered_and_gathered_for_the_prompt_rows_alone(P):
    # sequence 1: rows 30 .. 39, its prompt 35 long (5 prompt rows, keys 0 .. 34); sequence 2: all
    # generated (no keys); sequence 0: rows 0 .. 7 of a 72-token prompt (keys 0 .. 7)
    _, koff, lat = P.step([(1, 30, 10, 35), (2, 20, 4, 20), (0, 0, 8, 72)])
    assert koff.tolist() == [0, 35, 35, 43]
    want = np.concatenate([P.cache.tokens(1, LAYER, 35), P.cache.tokens(0, LAYER, 8)])[:, :KV_LORA]
    assert np.array_equal(M.from_bits(lat), want)


def test_a_prompt_row_gets_float64_s_attention_and_a_generated_row_nothing(P):
    o, *_ = P.step([(2, 0, 24, 24), (1, 30, 10, 35)])
    rows = [(2, p) for p in range(24)] + [(1, p) for p in range(30, 40)]
    worst = 0.0
    for j, (s, p) in enumerate(rows):
        if s == 1 and p >= 35:
            assert np.isnan(o[j]).all(), f"generated row {p} written"
            continue
        want = P.reference(s, p)
        worst = max(worst, float(np.abs(o[j] - want).max()))
    assert worst < 2e-2, worst  # P and o rounded to bf16 (values of scale 1)


def test_a_prompt_whole_cut_or_beside_others_gets_the_same_bits(P):
    n = LENGTHS[0]
    whole, *_ = P.step([(0, 0, n, n)])
    assert not np.isnan(whole).any()
    pieces = []
    for i, (lo, hi) in enumerate([(0, 1), (1, 30), (30, 33), (33, 64), (64, n)]):  # on and off tile boundaries
        other = [(1, 10 + i, 1 + i % 3, 12), (2, 0, 5, 24)]  # a sequence's generated rows, another's prompt rows
        o, *_ = P.step(other + [(0, lo, hi - lo, n)], block_order=i % 2)
        pieces.append(o[sum(r for _, _, r, _ in other):])
    assert np.array_equal(np.concatenate(pieces), whole), "a cut prompt's rows differ from the whole prompt's"
    # the same rows as the generated tail of a shorter prompt's step: its prompt rows alone written, the same bits
    o, *_ = P.step([(0, 40, 32, 50)])
    assert np.array_equal(o[:10], whole[40:50]) and np.isnan(o[10:]).all()
