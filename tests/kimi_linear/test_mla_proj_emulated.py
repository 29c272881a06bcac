"""MLA's up-projections on tensor cores (mla_tc.cu's mla_absorb_tc: the query's nope part into
latent space; mla_expand_tc: the attention's f32 latents out through kv_b's value rows, split in
two bf16 parts) compiled for the CPU with g++ against the emulated block (emu/):

- the emulated kernels agree with the numpy model of their order (mla_tc_model.model_absorb,
  model_expand) to the bit, and with float64 within an mma's rounding (expand: within the
  bf16 output's);
- a row's outputs are the same bits alone (decode's one row), among a tile's 64 rows at any
  place, and past a partial tile: what makes prefill's and decode's rows agree;
- shapes off the tiles (kv_lora not a multiple of 128 or of the staged 64, v_dim under 128,
  rows not a multiple of 64) leave nothing unwritten and write nothing out of bounds.

What it cannot say: the hardware's own sum of an mma (emulated as the model's), and speed.
Skipped without g++."""

from __future__ import annotations

import numpy as np
import pytest

from . import mla_tc_model as M
from tests.emu.build import ptr

from .emulate import build_emulator


@pytest.fixture(scope="module")
def emu(tmp_path_factory):
    return build_emulator(tmp_path_factory, "mla_tc_emu", "models/kimi_linear/kernels/cuda/mla_tc.cu",
                          "models/common/cuda/attention_tc.cuh")


SHAPES = [  # heads, nope, rope, v_dim, kv_lora
    (2, 32, 16, 32, 64),
    (3, 128, 64, 128, 512),  # Kimi-Linear's (fewer heads)
    (1, 48, 16, 40, 96),     # kv_lora past one 64-k slice, v_dim not a multiple of 16
    (2, 16, 16, 24, 160),    # kv_lora past a 128-column block
]


def inputs(heads, nope, rope, v_dim, kv_lora, rows, seed):
    rng = np.random.default_rng(seed)
    q = M.bf16_round(rng.standard_normal((rows, heads * (nope + rope))).astype(np.float32))
    kv_b = M.bf16_round((rng.standard_normal((heads * (nope + v_dim), kv_lora)) / 8).astype(np.float32))
    o_lat = (rng.standard_normal((rows, heads, kv_lora)) / 4).astype(np.float32)
    return q, kv_b, o_lat


def absorb(emu, q, kv_b, heads, nope, rope, v_dim, kv_lora):
    rows = q.shape[0]
    out = np.full((rows + 1, heads, kv_lora), np.nan, np.float32)  # a row past the end: never written
    emu.emu_mla_absorb_tc(ptr(M.bf16_bits(q)), ptr(M.bf16_bits(kv_b)), ptr(out), rows, heads, nope, rope, v_dim, kv_lora)
    assert np.isnan(out[rows]).all()
    return out[:rows]


def expand(emu, o_lat, kv_b, heads, nope, v_dim, kv_lora):
    rows = o_lat.shape[0]
    out = np.full((rows + 1, heads * v_dim), 0xFFFF, np.uint16)
    emu.emu_mla_expand_tc(ptr(np.ascontiguousarray(o_lat)), ptr(M.bf16_bits(kv_b)), ptr(out), rows, heads, nope, v_dim,
                          kv_lora)
    assert (out[rows] == 0xFFFF).all()
    return out[:rows]


@pytest.mark.parametrize("heads,nope,rope,v_dim,kv_lora", SHAPES)
def test_the_kernels_are_the_model_to_the_bit(emu, heads, nope, rope, v_dim, kv_lora):
    rows = 70  # a full tile of 64 and a partial one
    q, kv_b, o_lat = inputs(heads, nope, rope, v_dim, kv_lora, rows, seed=heads + nope + kv_lora)
    got = absorb(emu, q, kv_b, heads, nope, rope, v_dim, kv_lora)
    np.testing.assert_array_equal(got.view(np.uint32), M.model_absorb(q, kv_b, heads, nope, rope, v_dim,
                                                                      kv_lora).view(np.uint32))
    wk = kv_b.reshape(heads, nope + v_dim, kv_lora)[:, :nope].astype(np.float64)
    exact = np.einsum("rhd,hdc->rhc", q.reshape(rows, heads, nope + rope)[:, :, :nope].astype(np.float64), wk)
    np.testing.assert_allclose(got, exact, rtol=1e-5, atol=1e-5 * np.abs(exact).max())

    o = expand(emu, o_lat, kv_b, heads, nope, v_dim, kv_lora)
    np.testing.assert_array_equal(o, M.model_expand(o_lat, kv_b, heads, nope, v_dim, kv_lora))
    wv = kv_b.reshape(heads, nope + v_dim, kv_lora)[:, nope:].astype(np.float64)
    exact = np.einsum("rhc,hjc->rhj", o_lat.astype(np.float64), wv).reshape(rows, heads * v_dim)
    np.testing.assert_allclose(M.from_bits(o), exact, rtol=2 ** -8, atol=2 ** -8 * np.abs(exact).max())


def test_a_row_gets_the_same_bits_alone_and_anywhere_in_a_tile(emu):
    heads, nope, rope, v_dim, kv_lora = SHAPES[1]
    rows = 70
    q, kv_b, o_lat = inputs(heads, nope, rope, v_dim, kv_lora, rows, seed=5)
    many_q = absorb(emu, q, kv_b, heads, nope, rope, v_dim, kv_lora)
    many_o = expand(emu, o_lat, kv_b, heads, nope, v_dim, kv_lora)
    for r in (0, 17, 63, 64, 69):  # a tile's first, middle and last rows, the partial tile's
        alone_q = absorb(emu, q[r:r + 1], kv_b, heads, nope, rope, v_dim, kv_lora)
        np.testing.assert_array_equal(alone_q[0].view(np.uint32), many_q[r].view(np.uint32))
        alone_o = expand(emu, o_lat[r:r + 1], kv_b, heads, nope, v_dim, kv_lora)
        np.testing.assert_array_equal(alone_o[0], many_o[r])
    # the same rows in another order: each row's bits follow it
    perm = np.random.default_rng(1).permutation(rows)
    np.testing.assert_array_equal(absorb(emu, q[perm], kv_b, heads, nope, rope, v_dim, kv_lora).view(np.uint32),
                                  many_q[perm].view(np.uint32))
    np.testing.assert_array_equal(expand(emu, o_lat[perm], kv_b, heads, nope, v_dim, kv_lora), many_o[perm])
