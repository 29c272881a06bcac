"""MLA's up-projections on tensor cores (mla_tc.cu: mla_absorb_tc, the query's nope part into
latent space, q_lat f32; mla_expand_tc, the attention's f32 o_lat out through kv_b's value rows,
split hi + lo in bf16) on the GPU, each launch alone:

1. a row's outputs are the same bits alone (decode's one row), among 70 rows (a full tile of
   64 and a partial one) and with the rows shuffled: prefill's and decode's rows agree;
2. against the numpy model of their order (mla_tc_model.model_absorb / model_expand: each k16
   step's products summed in float64, rounded once) within an mma's rounding, and against the
   CUDA-core kernels the faster build keeps (mla.cu's mla_absorb / mla_expand, f32 arithmetic)
   within f32's (absorb) and the bf16 output's (expand) rounding.

The real shape (32 heads, nope 128, rope 64, v_dim 128, kv_lora 512) and the tiny checkpoint's
(4 heads, nope 16, rope 16, v_dim 16, kv_lora 32: a partial 128-column block).

    python -m pytest -q tests/kimi_linear/test_cuda_gpu_mla_proj.py   (on the H200; seconds)"""

from __future__ import annotations

import numpy as np
import pytest

from . import mla_tc_model as M

pytestmark = pytest.mark.gpu
SHAPES = [(32, 128, 64, 128, 512), (4, 16, 16, 16, 32)]  # heads, nope, rope, v_dim, kv_lora
ROWS = 70


class Proj:
    """One shape's random q (bf16), o_lat (f32) and kv_b (bf16) for ROWS rows; absorb(entry,
    rows) and expand(entry, rows) run one launch over those rows (indices into ROWS)."""

    def __init__(self, gpu, heads, nope, rope, v_dim, kv_lora, seed=0):
        rng = np.random.default_rng(seed)
        self.gpu, self.shape = gpu, (heads, nope, rope, v_dim, kv_lora)
        self.q = M.bf16_round(rng.standard_normal((ROWS, heads * (nope + rope))).astype(np.float32))
        self.kv_b = M.bf16_round((rng.standard_normal((heads * (nope + v_dim), kv_lora)) / 8).astype(np.float32))
        self.o_lat = (rng.standard_normal((ROWS, heads, kv_lora)) / 4).astype(np.float32)
        self.w = gpu.put(M.bf16_bits(self.kv_b))

    def _run(self, entry: str, named: dict) -> None:
        from tests.cuda.cuda_gpu import op_launches
        from kern.runtime.devices.cuda.launch import launch
        from kern_models.common.kernel_table import Op
        from kern_models.kimi_linear.kernels.cuda import table

        for la in op_launches(self.gpu, Op((entry,)).to_manifest(table.BY_ENTRY), named):
            launch(la, self.gpu.stream)
        self.gpu.stream.synchronize()

    def absorb(self, entry: str, rows: list[int]) -> np.ndarray:
        heads, nope, rope, v_dim, kv_lora = self.shape
        gpu, n = self.gpu, len(rows)
        out = gpu.empty(n * heads * kv_lora * 4)
        self._run(entry, dict(q=gpu.put(M.bf16_bits(self.q[rows])), kv_b=self.w, q_lat=out, rows=n, heads=heads,
                              nope=nope, rope=rope, v_dim=v_dim, kv_lora=kv_lora))
        got = gpu.get(out, np.float32, (n, heads, kv_lora))
        assert not np.isnan(got).any(), f"{entry} left an output unwritten"
        return got

    def expand(self, entry: str, rows: list[int]) -> np.ndarray:
        heads, nope, rope, v_dim, kv_lora = self.shape
        gpu, n = self.gpu, len(rows)
        out = gpu.empty(n * heads * v_dim * 2)
        self._run(entry, dict(o_lat=gpu.put(np.ascontiguousarray(self.o_lat[rows])), kv_b=self.w, o=out, rows=n,
                              heads=heads, nope=nope, v_dim=v_dim, kv_lora=kv_lora))
        got = gpu.get(out, np.uint16, (n, heads * v_dim))
        assert not (got == 0xFFFF).any(), f"{entry} left an output unwritten"
        return got


@pytest.fixture(scope="module", params=SHAPES, ids=lambda s: f"heads{s[0]}-lora{s[4]}")
def proj(gpu, request):
    return Proj(gpu, *request.param)


def test_a_row_gets_the_same_bits_alone_in_a_tile_and_shuffled(proj):
    every = list(range(ROWS))
    perm = [int(i) for i in np.random.default_rng(1).permutation(ROWS)]
    q_all, o_all = proj.absorb("mla_absorb_tc", every), proj.expand("mla_expand_tc", every)
    assert np.array_equal(proj.absorb("mla_absorb_tc", perm), q_all[perm])
    assert np.array_equal(proj.expand("mla_expand_tc", perm), o_all[perm])
    for r in (0, 17, 63, 64, 69):
        assert np.array_equal(proj.absorb("mla_absorb_tc", [r])[0], q_all[r]), f"absorb row {r}: alone != in a tile"
        assert np.array_equal(proj.expand("mla_expand_tc", [r])[0], o_all[r]), f"expand row {r}: alone != in a tile"


def test_the_model_and_the_cuda_core_kernels_agree_within_rounding(proj):
    heads, nope, rope, v_dim, kv_lora = proj.shape
    every = list(range(ROWS))
    q_lat = proj.absorb("mla_absorb_tc", every)
    want = M.model_absorb(proj.q, proj.kv_b, heads, nope, rope, v_dim, kv_lora)
    scale = np.abs(want).max()
    np.testing.assert_allclose(q_lat, want, rtol=1e-5, atol=1e-6 * scale)
    np.testing.assert_allclose(q_lat, proj.absorb("mla_absorb", every), rtol=1e-5, atol=1e-6 * scale)

    o = M.from_bits(proj.expand("mla_expand_tc", every))
    want = M.from_bits(M.model_expand(proj.o_lat, proj.kv_b, heads, nope, v_dim, kv_lora))
    scale = np.abs(want).max()
    np.testing.assert_allclose(o, want, rtol=2 ** -7, atol=2 ** -9 * scale)  # an output's bf16 ulp
    np.testing.assert_allclose(o, M.from_bits(proj.expand("mla_expand", every)), rtol=2 ** -7, atol=2 ** -9 * scale)
