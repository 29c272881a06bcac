"""The default build's prefill MLA on the GPU, a prompt token in the expanded form (mla_tc.cu's
mla_keys, mla_gather and mla_attend_x, the invariant GEMM between them; docs/hybrid.md), over
a paged cache of random latents, at the real shape (32 heads, nope 128, rope 64, v_dim 128,
kv_lora 512) and a small one (9 heads: partial row tiles; v_dim 24: output tiles past it):

1. the keys numbered for the prompt rows alone and their latents gathered exactly;
2. mla_attend_x over given expanded keys against float64, within bf16's rounding of P and o;
   a prompt whole, cut (beside another sequence's prompt and generated rows): the same bits;
   its wgmma twin mla_attend_x_wg (not in a build yet) the same, and mla_attend_x's bits;
3. the whole op chain as the manifest calls it (mla_gather, linear_rows' GEMM through kv_b,
   mla_attention): prompt rows within rounding of float64's expanded attention over the same
   bf16 keys, generated rows the bytes decode's absorbed form gives them (mla_attention_decode).

    python -m pytest -q tests/kimi_linear/test_cuda_gpu_mla_x.py   (on the H200; seconds)"""

from __future__ import annotations

import numpy as np
import pytest

from . import mla_tc_model as M

pytestmark = pytest.mark.gpu
LAYER = 1
SHAPES = [(32, 128, 64, 128, 512), (9, 16, 16, 24, 32)]  # heads, nope, rope, v_dim, kv_lora
LENGTHS = [150, 70, 40]


class Setup:
    def __init__(self, gpu, heads, nope, rope, v_dim, kv_lora, seed=0):
        from kern_models.kimi_linear.kernels.cuda import table

        rng = np.random.default_rng(seed)
        self.gpu, self.heads, self.nope, self.rope, self.v_dim, self.kv_lora = gpu, heads, nope, rope, v_dim, kv_lora
        self.cache = M.Cache(rng, LENGTHS, kv_lora, rope)
        self.kv = gpu.put(self.cache.bits)
        qd = nope + rope
        self.q = [M.bf16_bits((rng.standard_normal((n, heads, qd)) * 0.5).astype(np.float32)) for n in LENGTHS]
        self.kx = [M.bf16_bits(rng.standard_normal((n, heads, nope + v_dim)).astype(np.float32)) for n in LENGTHS]
        self.kv_b = M.bf16_bits((rng.standard_normal((heads * (nope + v_dim), kv_lora)) / np.sqrt(kv_lora)).astype(np.float32))
        self.ops = table.ops("tc", "tensor")

    def named(self, seqs):
        """A step of seqs = [(sequence, first position, rows, prompt_len)]: its inputs by name."""
        c, gpu = self.cache, self.gpu
        cu = np.cumsum([0] + [n for _, _, n, _ in seqs]).astype(np.int32)
        pos = np.concatenate([np.arange(p, p + n) for _, p, n, _ in seqs]).astype(np.int32)
        q = np.concatenate([self.q[s][p:p + n] for s, p, n, _ in seqs])
        return dict(q=gpu.put(q), kv=self.kv, page_table=gpu.put(np.ascontiguousarray(c.table[[s for s, *_ in seqs]])),
                    cu_seqlens=gpu.put(cu), pos=gpu.put(pos), prompt_len=gpu.put(np.asarray([x[3] for x in seqs], np.int32)),
                    pages_per_seq=c.pages_per_seq, rows=int(cu[-1]), n_seqs=len(seqs), layer=LAYER, layers=c.layers,
                    heads=self.heads, nope=self.nope, rope=self.rope, kv_lora=self.kv_lora, v_dim=self.v_dim,
                    page_tokens=c.page_tokens, token_bytes=c.token_bytes)

    def run(self, spec: dict, named: dict) -> None:
        from tests.cuda.cuda_gpu import op_launches
        from kern.runtime.devices.cuda.launch import launch

        for la in op_launches(self.gpu, spec, named):
            launch(la, self.gpu.stream)
        self.gpu.stream.synchronize()

    def gather(self, seqs):
        from kern_models.common.kernel_table import Op
        from kern_models.kimi_linear.kernels.cuda import table

        gpu, named = self.gpu, self.named(seqs)
        need = [min(p + n, pl) if p < pl else 0 for _, p, n, pl in seqs]
        keys = max(1, sum(need))
        named |= dict(keys=keys, koff=gpu.put(np.full(len(seqs) + 1, -1, np.int32)),
                      lat=gpu.put(np.full(keys * self.kv_lora, 0xFFFF, np.uint16)))
        self.run(self.ops["mla_gather"], named)
        koff = gpu.get(named["koff"], np.int32, (len(seqs) + 1,))
        return named, koff, gpu.get(named["lat"], np.uint16, (keys, self.kv_lora)), Op, table

    def attend_x(self, seqs, entry="mla_attend_x"):
        """mla_attend_x (or entry: its wgmma twin) alone over the setup's own expanded keys: o [rows,
        heads, v_dim] as f32 (NaN: unwritten)."""
        named, koff, _, Op, table = self.gather(seqs)
        gpu, keys = self.gpu, named["keys"]
        kx = np.zeros((keys, self.heads * (self.nope + self.v_dim)), np.uint16)
        for i, (s, *_) in enumerate(seqs):
            for t in range(koff[i + 1] - koff[i]):
                kx[koff[i] + t] = self.kx[s][t].reshape(-1)
        rows = named["rows"]
        named |= dict(kx=gpu.put(kx), o=gpu.put(np.full(rows * self.heads * self.v_dim, 0x7FC0, np.uint16)))
        self.run(Op((entry,)).to_manifest(table.BY_ENTRY), named)
        return M.from_bits(gpu.get(named["o"], np.uint16, (rows, self.heads, self.v_dim)))

    def reference(self, s, p, kx) -> np.ndarray:
        """float64's attention of (s, p) over keys 0 .. p, kx [keys, heads, nope + v_dim] (f32 values)."""
        q = M.from_bits(self.q[s][p]).astype(np.float64)
        rope = self.cache.tokens(s, LAYER, p + 1)[:, self.kv_lora:].astype(np.float64)
        out = np.empty((self.heads, self.v_dim))
        for h in range(self.heads):
            k = np.concatenate([kx[:p + 1, h, :self.nope], rope], axis=1)
            sc = k @ q[h] / np.sqrt(self.nope + self.rope)
            w = np.exp(sc - sc.max())
            out[h] = (w / w.sum()) @ kx[:p + 1, h, self.nope:]
        return out


@pytest.fixture(scope="module", params=SHAPES, ids=lambda s: f"heads{s[0]}-v{s[3]}")
def setup(gpu, request):
    return Setup(gpu, *request.param)


def test_the_keys_of_the_prompt_rows_are_numbered_and_gathered(setup):
    _, koff, lat, *_ = setup.gather([(1, 30, 10, 35), (2, 20, 4, 20), (0, 0, 8, 150)])
    assert koff.tolist() == [0, 35, 35, 43]
    want = np.concatenate([setup.cache.tokens(1, LAYER, 35), setup.cache.tokens(0, LAYER, 8)])[:, :setup.kv_lora]
    assert np.array_equal(M.from_bits(lat), want)


def test_a_prompt_row_gets_float64_s_attention_whole_or_cut(setup):
    n = LENGTHS[0]
    whole = setup.attend_x([(0, 0, n, n)])
    assert not np.isnan(whole).any()
    kx = M.from_bits(setup.kx[0])
    worst = max(float(np.abs(whole[p] - setup.reference(0, p, kx)).max()) for p in (0, 1, 31, 32, 63, 64, 100, n - 1))
    assert worst < 2e-2, worst  # P and o rounded to bf16, values of scale 1
    pieces = []
    for i, (lo, hi) in enumerate([(0, 1), (1, 33), (33, 100), (100, n)]):
        other = [(1, 10 + i, 1 + i % 3, 5), (2, 0, 5 + i, 40)]  # a sequence's generated rows (past its prompt of 5), another's prompt rows
        got = setup.attend_x(other + [(0, lo, hi - lo, n)])
        skip = sum(r for _, _, r, _ in other)
        assert np.isnan(got[:other[0][2]]).all(), "a generated row written by the expanded form"
        pieces.append(got[skip:])
    assert np.array_equal(np.concatenate(pieces), whole), "a cut prompt's rows != the whole prompt's"


def test_mla_attend_x_wg_gets_float64_s_attention_and_mla_attend_x_s_bits_whole_or_cut(setup):
    """The wgmma twin (128-row tiles: the 150-row prompt is two) against float64, against
    mla_attend_x bit for bit (the same order op for op; a k16 step sums alike through wgmma and
    mma.sync, wgmma.cuh), and cut beside other rows: the same bits."""
    n = LENGTHS[0]
    whole = setup.attend_x([(0, 0, n, n)], "mla_attend_x_wg")
    assert not np.isnan(whole).any()
    kx = M.from_bits(setup.kx[0])
    worst = max(float(np.abs(whole[p] - setup.reference(0, p, kx)).max())
                for p in (0, 1, 31, 32, 63, 64, 100, 127, 128, n - 1))
    assert worst < 2e-2, worst
    assert np.array_equal(whole, setup.attend_x([(0, 0, n, n)])), "mla_attend_x_wg's bits != mla_attend_x's"
    pieces = []
    for i, (lo, hi) in enumerate([(0, 1), (1, 33), (33, 129), (129, n)]):
        other = [(1, 10 + i, 1 + i % 3, 5), (2, 0, 5 + i, 40)]  # a sequence's generated rows (past its prompt of 5), another's prompt rows
        got = setup.attend_x(other + [(0, lo, hi - lo, n)], "mla_attend_x_wg")
        assert np.isnan(got[:other[0][2]]).all(), "a generated row written by the expanded form"
        pieces.append(got[sum(r for _, _, r, _ in other):])
    assert np.array_equal(np.concatenate(pieces), whole), "a cut prompt's rows != the whole prompt's"


def test_the_op_chain_gives_prompt_rows_the_expanded_form_and_generated_rows_decode_s(setup):
    gpu, heads, v_dim, kv_lora = setup.gpu, setup.heads, setup.v_dim, setup.kv_lora
    # sequence 1's last 5 prompt rows and 5 generated ones; sequence 0's rows 20 .. 59 of its prompt
    seqs = [(1, 30, 10, 35), (0, 20, 40, 150)]
    named, koff, _, Op, table = setup.gather(seqs)
    keys, rows = named["keys"], named["rows"]
    n_out = heads * (setup.nope + v_dim)
    kv_b = gpu.put(setup.kv_b)
    named |= dict(kx=gpu.empty(keys * n_out * 2), kv_b=kv_b, o=gpu.put(np.full(rows * heads * v_dim, 0x7FC0, np.uint16)),
                  q_lat=gpu.empty(rows * heads * kv_lora * 4), o_lat=gpu.empty(rows * heads * kv_lora * 4), chunk=M.CHUNK)
    setup.run(setup.ops["linear_rows"], dict(x=named["lat"], W=kv_b, y=named["kx"], rows=keys, N=n_out, K=kv_lora))
    setup.run(setup.ops["mla_attention"], named)
    o = M.from_bits(gpu.get(named["o"], np.uint16, (rows, heads, v_dim)))
    kx = M.from_bits(gpu.get(named["kx"], np.uint16, (keys, heads, setup.nope + v_dim)))
    # the GEMM's keys: float64's product of the same bf16 values, within bf16's rounding
    lat = np.concatenate([setup.cache.tokens(1, LAYER, 35), setup.cache.tokens(0, LAYER, 60)])[:, :kv_lora]
    want_kx = (lat.astype(np.float64) @ M.from_bits(setup.kv_b).astype(np.float64).T).reshape(keys, heads, -1)
    assert np.abs(kx - want_kx).max() <= 2 ** -7 * max(1.0, np.abs(want_kx).max())
    for j, (s, p) in enumerate([(1, p) for p in range(30, 40)] + [(0, p) for p in range(20, 60)]):
        if s == 1 and p >= 35:  # a generated row: decode's bytes
            dec = gpu.put(np.full(heads * v_dim, 0x7FC0, np.uint16))
            splits = -(-(p + 1) // M.CHUNK)
            one = dict(q=gpu.put(setup.q[s][p][None]), kv=setup.kv, page_table=gpu.put(setup.cache.table[[s]]),
                       pos=gpu.put(np.asarray([p], np.int32)), kv_b=kv_b, o=dec, q_lat=gpu.empty(heads * kv_lora * 4),
                       o_lat=gpu.empty(heads * kv_lora * 4), part_o=gpu.empty(heads * splits * kv_lora * 4),
                       part_ml=gpu.empty(heads * splits * 2 * 4), sem=gpu.put(np.zeros(heads, np.int32)),
                       pages_per_seq=setup.cache.pages_per_seq, rows=1, layer=LAYER, layers=setup.cache.layers, heads=heads,
                       nope=setup.nope, rope=setup.rope, kv_lora=kv_lora, page_tokens=setup.cache.page_tokens,
                       token_bytes=setup.cache.token_bytes, chunk=M.CHUNK, splits=splits, v_dim=v_dim)
            setup.run(setup.ops["mla_attention_decode"], one)
            assert np.array_equal(M.from_bits(gpu.get(dec, np.uint16, (heads, v_dim))), o[j]), f"generated row {p}"
            continue
        base = koff[0] if s == 1 else koff[1]
        want = setup.reference(s, p, kx[base:base + p + 1])
        assert np.abs(o[j] - want).max() < 2e-2, (s, p)
