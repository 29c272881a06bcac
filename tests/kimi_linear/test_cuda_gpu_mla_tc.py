"""MLA's attention on tensor cores (mla_tc.cu: mla_attend_tc for prefill, mla_attend_tc_decode
for decode) on the GPU, the attend launch alone (q_lat f32 and q in, o_lat f32 out, over a paged
cache of random latents), bit for bit where the contract says so (docs/determinism.md):

1. a prompt attended in one prefill call, cut at several points (each piece beside another
   sequence's rows), and decoded token by token: every row's o_lat the same bits;
2. a row decoded alone and beside others (shuffled, other sequences), and a prefill row beside
   different companions: the same bits;
3. against a float64 numpy reference of the absorbed attention (q_lat rounded to bf16, as the
   kernel rounds it) within bf16's rounding, and against the CUDA-core kernel mla.cu keeps for
   the faster build (mla_attend*, q_lat in f32) within the same tolerance;
4. the split (keys in chunks of `chunk` from key 0, folded in order; a decode block a chunk):
   at a small chunk (32, 64) a prompt cut across chunk boundaries, decoded past several chunks,
   alone and in a batch, gets the same bits, the counters are zero after every launch, and the
   numpy model of the order agrees within rounding; at the deployment's chunk (2,048) a
   sequence of 5,000 tokens (3 chunks) at the real shape: prefill rows at and past the chunk
   boundaries = decoded alone = decoded among 8 rows.

The real shape (32 heads, kv_lora 512, rope 64, nope 128) and the tiny checkpoint's (9 heads:
a partial head group; kv_lora 32, rope 16: short and empty runs of the scores).

    python -m pytest -q tests/kimi_linear/test_cuda_gpu_mla_tc.py   (on the H200; seconds)"""

from __future__ import annotations

import numpy as np
import pytest

from . import mla_tc_model as M

pytestmark = pytest.mark.gpu
LAYER = 1
SHAPES = [(32, 128, 64, 512), (9, 16, 16, 32)]  # heads, nope, rope, kv_lora


class Attend:
    """One shape's cache (3 sequences of 150, 70 and 40 cached tokens) and queries (q_lat f32,
    q bf16 [rows, heads, nope | rope]) for every position of every sequence; attend(entry,
    picks) runs one launch over rows picks = [(seq, pos), ...] and returns o_lat [rows, heads,
    kv_lora] f32 (prefill's entries group the picks by sequence, in order, as cu_seqlens)."""

    LENGTHS = [150, 70, 40]

    def __init__(self, gpu, heads, nope, rope, kv_lora, seed=0):
        rng = np.random.default_rng(seed)
        self.gpu, self.heads, self.nope, self.rope, self.kv_lora = gpu, heads, nope, rope, kv_lora
        self.cache = M.Cache(rng, self.LENGTHS, kv_lora, rope)
        self.kv = gpu.put(self.cache.bits)
        self.q_lat = [(rng.standard_normal((n, heads, kv_lora)) * 0.6).astype(np.float32) for n in self.LENGTHS]
        self.q = [M.bf16_bits((rng.standard_normal((n, heads, nope + rope)) * 0.6).astype(np.float32))
                  for n in self.LENGTHS]

    def attend(self, entry: str, picks: list[tuple[int, int]], chunk: int = M.CHUNK, extra: int = 1) -> np.ndarray:
        """chunk: mla_tc's split (the tensor-core entries); decode's grid holds `extra` chunks
        more than its longest row needs (the step's reach past it)."""
        from tests.cuda.cuda_gpu import op_launches
        from kern.runtime.devices.cuda.launch import launch
        from kern_models.common.kernel_table import Op
        from kern_models.kimi_linear.kernels.cuda import table

        gpu, c, rows = self.gpu, self.cache, len(picks)
        prefill = not entry.endswith("_decode")
        named = dict(q_lat=gpu.put(np.stack([self.q_lat[s][p] for s, p in picks])),
                     q=gpu.put(np.stack([self.q[s][p] for s, p in picks])), kv=self.kv,
                     pos=gpu.put(np.asarray([p for _, p in picks], np.int32)),
                     o_lat=gpu.empty(rows * self.heads * self.kv_lora * 4), pages_per_seq=c.pages_per_seq, rows=rows,
                     layer=LAYER, layers=c.layers, heads=self.heads, nope=self.nope, rope=self.rope,
                     kv_lora=self.kv_lora, page_tokens=c.page_tokens, token_bytes=c.token_bytes)
        tc = "_tc" in entry
        if tc:
            named["chunk"] = chunk
        if tc and not prefill:
            splits = max(-(-(p + 1) // chunk) for _, p in picks) + extra
            named |= dict(splits=splits, part_o=gpu.empty(rows * self.heads * splits * self.kv_lora * 4),
                          part_ml=gpu.empty(rows * self.heads * splits * 2 * 4),
                          sem=gpu.put(np.zeros(rows * self.heads, np.int32)))
        if prefill:
            seqs = [s for i, (s, _) in enumerate(picks) if i == 0 or picks[i - 1][0] != s]
            assert len(seqs) == len(set(seqs)), "prefill's rows: each sequence's together"
            cu = np.cumsum([0] + [sum(1 for s2, _ in picks if s2 == s) for s in seqs]).astype(np.int32)
            named |= dict(page_table=gpu.put(c.table[seqs]), cu_seqlens=gpu.put(cu), n_seqs=len(seqs),
                          prompt_len=gpu.put(np.zeros(len(seqs), np.int32)))  # every row generated: the absorbed form's
        else:
            named |= dict(page_table=gpu.put(c.table[[s for s, _ in picks]]))
        spec = Op((entry,)).to_manifest(table.BY_ENTRY)
        for la in op_launches(gpu, spec, named):
            launch(la, gpu.stream)
        gpu.stream.synchronize()
        out = gpu.get(named["o_lat"], np.float32, (rows, self.heads, self.kv_lora))
        assert not np.isnan(out).any(), f"{entry} left an output unwritten (or NaN)"
        if "sem" in named:
            assert not gpu.get(named["sem"], np.int32, (rows * self.heads,)).any(), "a split counter not zero again"
        return out


@pytest.fixture(scope="module", params=SHAPES, ids=lambda s: f"heads{s[0]}-lora{s[3]}")
def attn(gpu, request):
    return Attend(gpu, *request.param)


def test_a_prompt_whole_cut_or_decoded_gets_the_same_bits(attn):
    n = attn.LENGTHS[0]
    whole = attn.attend("mla_attend_tc", [(0, p) for p in range(n)])
    # cut at 1, 33 and 100: each piece a prefill call beside another sequence's rows
    pieces = []
    for lo, hi in [(0, 1), (1, 33), (33, 100), (100, n)]:
        other = [(1, p) for p in range(10, 10 + (hi - lo) % 7 + 1)]
        got = attn.attend("mla_attend_tc", other + [(0, p) for p in range(lo, hi)])
        pieces.append(got[len(other):])
    assert np.array_equal(np.concatenate(pieces), whole), "cut prefill != whole prefill"
    for p in range(n):
        one = attn.attend("mla_attend_tc_decode", [(0, p)])
        assert np.array_equal(one[0], whole[p]), f"position {p}: decoded != prefilled"


def test_a_row_alone_or_beside_others_gets_the_same_bits(attn):
    rng = np.random.default_rng(1)
    rows = [(s, p) for s, n in enumerate(attn.LENGTHS) for p in (0, n // 2, n - 1)]
    alone = {r: attn.attend("mla_attend_tc_decode", [r])[0] for r in rows}
    for _ in range(3):  # a decode batch of 64 rows of the three sequences, shuffled
        batch = [rows[i] for i in rng.permutation(len(rows))] + \
                [(int(s), int(rng.integers(attn.LENGTHS[s]))) for s in rng.integers(0, 3, 64 - len(rows))]
        got = attn.attend("mla_attend_tc_decode", batch)
        for j, r in enumerate(batch[:len(rows)]):
            assert np.array_equal(got[j], alone[r]), f"row {r} in a batch of 64 != alone"
    # prefill: sequence 2's rows alone, then after sequence 1's
    mine = [(2, p) for p in range(attn.LENGTHS[2])]
    solo = attn.attend("mla_attend_tc", mine)
    beside = attn.attend("mla_attend_tc", [(1, p) for p in range(attn.LENGTHS[1])] + mine)[attn.LENGTHS[1]:]
    assert np.array_equal(beside, solo)
    for p in (0, attn.LENGTHS[2] // 2, attn.LENGTHS[2] - 1):  # and prefill's rows are decode's
        assert np.array_equal(solo[p], alone[(2, p)]), f"position {p}: prefilled != decoded"


def _tolerance(got, want):
    """bf16's rounding of P (and of q): a weighted mean of latents ~N(0, 1) off by ~2^-8."""
    err = np.abs(got - want)
    return err.max(), err.mean()


def test_the_kernel_matches_float64_attention_and_the_cuda_core_kernel(attn):
    picks = [(0, p) for p in (0, 1, 31, 32, 33, 63, 64, 100, 149)] + [(1, 69), (2, 0), (2, 39)]
    got = attn.attend("mla_attend_tc_decode", picks)
    old = attn.attend("mla_attend_decode", picks)
    width = attn.kv_lora + attn.rope
    worst = []
    for j, (s, p) in enumerate(picks):
        keys = attn.cache.tokens(s, LAYER, p + 1)
        for h in range(attn.heads):
            q_abs = np.concatenate([attn.q_lat[s][p, h], M.from_bits(attn.q[s][p, h, attn.nope:])])
            assert q_abs.shape == (width,)
            want = M.reference(M.bf16_round(q_abs), keys, attn.kv_lora, attn.nope, attn.rope)
            worst.append(_tolerance(got[j, h], want))
    mx, mean = max(w[0] for w in worst), float(np.mean([w[1] for w in worst]))
    assert mx < 1.5e-2 and mean < 2e-3, (mx, mean)
    # the CUDA-core kernel keeps q_lat in f32: the two differ by q's rounding and P's
    d = np.abs(got - old)
    assert d.max() < 3e-2 and d.mean() < 3e-3, (d.max(), d.mean())
    # and its prefill twin gives the decode kernel's bits
    pre = attn.attend("mla_attend_tc", [(0, p) for p in range(150)])
    for j, (s, p) in enumerate(picks):
        if s == 0:
            assert np.array_equal(pre[p], got[j])


@pytest.mark.parametrize("chunk", [32, 64])
def test_the_split_gives_a_prompt_cut_across_chunks_and_decoded_the_same_bits(attn, chunk):
    """Sequence 0's 150 tokens are 3 to 5 chunks: cut at and beside the boundaries, each piece
    beside another sequence's rows; decoded alone and in a shuffled batch (more chunks in the
    grid than any row needs)."""
    n = attn.LENGTHS[0]
    whole = attn.attend("mla_attend_tc", [(0, p) for p in range(n)], chunk)
    pieces = []
    for lo, hi in [(0, 1), (1, chunk - 1), (chunk - 1, chunk + 1), (chunk + 1, 2 * chunk), (2 * chunk, n)]:
        other = [(1, p) for p in range(10, 10 + (hi - lo) % 5 + 1)]
        pieces.append(attn.attend("mla_attend_tc", other + [(0, p) for p in range(lo, hi)], chunk)[len(other):])
    assert np.array_equal(np.concatenate(pieces), whole), "cut prefill != whole prefill"
    one = attn.attend("mla_attend_tc_decode", [(0, p) for p in range(n)], chunk)  # every row its own blocks
    assert np.array_equal(one, whole), "decoded != prefilled"
    rng = np.random.default_rng(chunk)
    picks = [(0, p) for p in (0, chunk - 1, chunk, chunk + 1, 2 * chunk, n - 1)]
    for _ in range(2):
        batch = [picks[i] for i in rng.permutation(len(picks))] + [(1, attn.LENGTHS[1] - 1), (2, attn.LENGTHS[2] - 1), (1, 3)]
        got = attn.attend("mla_attend_tc_decode", batch, chunk, extra=3)
        for j, (_, p) in enumerate(batch[:len(picks)]):
            assert np.array_equal(got[j], whole[p]), f"position {p}: decoded in a batch != prefilled"
    for p in (chunk, n - 1):
        assert np.array_equal(attn.attend("mla_attend_tc_decode", [(0, p)], chunk)[0], whole[p])
    # the numpy model of the split order, within rounding
    for p in (chunk + 1, n - 1):
        keys = attn.cache.tokens(0, LAYER, p + 1)
        q_abs = np.concatenate([attn.q_lat[0][p], M.from_bits(attn.q[0][p, :, attn.nope:])], axis=1)
        want = M.model_rows(q_abs, lambda i: keys, np.full(attn.heads, p + 1), attn.kv_lora, attn.nope, attn.rope,
                            chunk=chunk)
        assert np.abs(whole[p] - want).max() < 1e-4 * max(1.0, np.abs(want).max()), p


def test_the_split_at_the_deployment_chunk_over_a_long_sequence(gpu):
    """The real shape, one sequence of 5,000 tokens (chunks of 2,048: 3) beside a short one:
    prefill rows around the boundaries = decoded alone = decoded among 8 rows, and float64."""
    heads, nope, rope, kv_lora = SHAPES[0]
    rng = np.random.default_rng(3)
    a = Attend.__new__(Attend)
    a.gpu, a.heads, a.nope, a.rope, a.kv_lora = gpu, heads, nope, rope, kv_lora
    a.LENGTHS = [5000, 40]
    a.cache = M.Cache(rng, a.LENGTHS, kv_lora, rope)
    a.kv = gpu.put(a.cache.bits)
    a.q_lat = [(rng.standard_normal((n, heads, kv_lora)) * 0.6).astype(np.float32) for n in a.LENGTHS]
    a.q = [M.bf16_bits((rng.standard_normal((n, heads, nope + rope)) * 0.6).astype(np.float32)) for n in a.LENGTHS]
    ps = [2046, 2047, 2048, 2049, 4095, 4096, 4999]
    pre = a.attend("mla_attend_tc", [(0, p) for p in range(2040, 2056)] + [(0, p) for p in range(4090, 4100)]
                   + [(0, 4999)])
    at = {p: i for i, p in enumerate([*range(2040, 2056), *range(4090, 4100), 4999])}
    batch = a.attend("mla_attend_tc_decode", [(1, 39), *[(0, p) for p in ps]])
    for j, p in enumerate(ps):
        alone = a.attend("mla_attend_tc_decode", [(0, p)])[0]
        assert np.array_equal(alone, pre[at[p]]), f"position {p}: decoded alone != prefilled"
        assert np.array_equal(batch[1 + j], pre[at[p]]), f"position {p}: decoded among 8 rows != prefilled"
    keys = a.cache.tokens(0, LAYER, 5000)
    for h in (0, heads - 1):
        q_abs = np.concatenate([a.q_lat[0][4999, h], M.from_bits(a.q[0][4999, h, nope:])])
        want = M.reference(M.bf16_round(q_abs), keys, kv_lora, nope, rope)
        assert np.abs(pre[at[4999], h] - want).max() < 1.5e-2
