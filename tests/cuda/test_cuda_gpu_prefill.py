"""prefill_attention (prefill_attention.cubin) on the GPU against a float64 numpy reference:
several sequences packed by cu_seqlens, each with a cached prefix in pages and a new chunk,
lengths not multiples of 16 or 64, GQA; then a 2040-token timing on Llama-3.2-1B heads.
Outputs are poisoned (NaN) before each run, so an unwritten element fails."""


import numpy as np
import pytest

from tests.cuda import cuda_refs as R
from tests.cuda.cuda_refs import BF16

pytestmark = pytest.mark.gpu

BM = 64  # query rows per tile (prefill_attention.cu)


def grid(nq, rows, n_seqs):
    return (nq, -(-rows // BM) + n_seqs)


def paged(rng, lens_total, n_layers, nkv, pt, hd):
    """Random bf16 state with every sequence's pages scattered; page-table entries past a
    sequence's context point far outside the state (a read there faults)."""
    pps = max(-(-n // pt) for n in lens_total) + 1
    need = [-(-n // pt) for n in lens_total]
    n_pages = sum(need) + 3
    perm = rng.permutation(n_pages)
    table = np.full((len(lens_total), pps), 1 << 28, np.int32)
    k = 0
    for s, n in enumerate(need):
        table[s, :n] = perm[k : k + n]
        k += n
    state = R.rand_bf16(rng, (n_pages, n_layers, 2, nkv, pt, hd))
    return table, state, pps


def reference(q, state, table, cu, pos, layer, nq, nkv, hd, pt):
    """float64 causal attention: row r of sequence s sees positions 0..pos[r] of s."""
    rows, G = len(pos), nq // nkv
    out = np.zeros((rows, nq * hd))
    st = R.f32(state).astype(np.float64)
    qf = R.f32(q).astype(np.float64)
    for s in range(len(cu) - 1):
        rr = np.arange(cu[s], cu[s + 1])
        if len(rr) == 0:
            continue
        t = np.arange(int(pos[rr].max()) + 1)
        pages = table[s, t // pt]
        K = st[pages, layer, 0, :, t % pt]  # [keys, nkv, hd]
        V = st[pages, layer, 1, :, t % pt]
        masked = t[None, :] > pos[rr][:, None]
        for hq in range(nq):
            h = hq // G
            sc = qf[rr, hq * hd : (hq + 1) * hd] @ K[:, h].T / np.sqrt(hd)
            sc[masked] = -np.inf
            p = np.exp(sc - sc.max(axis=1, keepdims=True))
            out[rr, hq * hd : (hq + 1) * hd] = (p / p.sum(axis=1, keepdims=True)) @ V[:, h]
    return out


def run_prefill(gpu, q, state, table, cu, pos, pps, layer, n_layers, nq, nkv, hd, pt, q_stride, dq=None):
    rows, n_seqs = len(pos), len(cu) - 1
    do = gpu.empty(rows * nq * hd * 2)
    args = (dq if dq is not None else gpu.put(q), gpu.put(state), gpu.put(table), gpu.put(cu), gpu.put(pos), do,
            rows, n_seqs, pps, layer, n_layers, nq, nkv, hd, pt, q_stride)
    gpu.run("prefill_attention", grid(nq, rows, n_seqs), 128, *args)
    return do, args


@pytest.mark.parametrize("nq,nkv,hd", [(32, 8, 64), (16, 8, 128), (9, 3, 64), (8, 8, 64)])
def test_prefill_attention_chunks_over_cached_prefixes(gpu, nq, nkv, hd):
    rng = np.random.default_rng(11 + hd + nq)
    n_layers, layer, pt = 2, 1, 16
    prefix = [0, 37, 200, 5, 130, 64]
    chunk = [70, 130, 1, 64, 3, 129]
    table, state, pps = paged(rng, [p + c for p, c in zip(prefix, chunk)], n_layers, nkv, pt, hd)
    pos = np.concatenate([np.arange(p, p + c) for p, c in zip(prefix, chunk)]).astype(np.int32)
    cu = np.concatenate([[0], np.cumsum(chunk)]).astype(np.int32)
    rows = len(pos)
    width = (nq + 2 * nkv) * hd  # q is the first column slice of a fused qkv buffer
    qkv = R.rand_bf16(rng, (rows, width), 2.0)
    do, args = run_prefill(gpu, qkv, state, table, cu, pos, pps, layer, n_layers, nq, nkv, hd, pt, width)
    got = R.f32(gpu.get(do, BF16, (rows, nq * hd)))
    assert not np.isnan(got).any(), "unwritten or NaN outputs"
    ref = reference(qkv[:, : nq * hd], state, table, cu, pos, layer, nq, nkv, hd, pt)
    rel = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    print(f"\nprefill_attention nq={nq} nkv={nkv} hd={hd} rows={rows}: rel err {rel:.2e}, "
          f"max abs {np.abs(got - ref).max():.2e}")
    np.testing.assert_allclose(got, ref, atol=1e-2, rtol=1e-2)
    assert rel < 5e-3
    gpu.run("prefill_attention", grid(nq, rows, len(cu) - 1), 128, *args)  # deterministic
    assert np.array_equal(R.f32(gpu.get(do, BF16, (rows, nq * hd))), got)


def _time(gpu, launches, reps):
    return gpu.graph_ms(launches * reps, reps)


@pytest.mark.parametrize("nq,nkv,hd,old", [(32, 8, 64, True), (16, 8, 128, False), (9, 3, 64, False)])
def test_prefill_attention_2040_tokens_timing(gpu, nq, nkv, hd, old):
    """One 2040-token sequence (one layer of a 16-layer state): ms per layer, against the
    row-parallel attention_prefill + attention_combine that the manifest used before."""
    rng = np.random.default_rng(3)
    n_layers, layer, pt, rows = 16, 3, 16, 2040
    table, state, pps = paged(rng, [rows], n_layers, nkv, pt, hd)
    pos = np.arange(rows, dtype=np.int32)
    cu = np.array([0, rows], np.int32)
    width = (nq + 2 * nkv) * hd
    qkv = R.rand_bf16(rng, (rows, width), 2.0)
    dq = gpu.put(qkv)
    do, args = run_prefill(gpu, qkv, state, table, cu, pos, pps, layer, n_layers, nq, nkv, hd, pt, width, dq)
    got = R.f32(gpu.get(do, BF16, (rows, nq * hd)))
    assert not np.isnan(got).any()
    sub = np.r_[0:3, 63:66, 1000:1003, 2037:2040]  # a few rows against the reference
    ref = _rows_reference(qkv, state, table, pos, sub, layer, nq, nkv, hd, pt)
    np.testing.assert_allclose(got[sub], ref, atol=1e-2, rtol=1e-2)
    flops = 4.0 * hd * nq * float((pos + 1).sum())
    ms = _time(gpu, [gpu.make("prefill_attention", grid(nq, rows, 1), 128, *args)], 20)
    line = (f"prefill_attention 2040 tok nq={nq} nkv={nkv} hd={hd}: {ms * 1e3:8.1f} us/layer "
            f"({flops / ms / 1e9:6.1f} TFLOP/s)")
    if old:
        split, n_splits = 512, 8  # what the manifest used with it: 512-token splits, context 4096
        part_o, part_ml = gpu.empty(rows * nq * n_splits * hd * 4), gpu.empty(rows * nq * n_splits * 8)
        do2 = gpu.empty(rows * nq * hd * 2)
        a = (dq, args[1], args[2], args[3], args[4], part_o, part_ml, do2, rows, 1, pps, layer, n_layers,
             nq, nkv, hd, pt, split, width)
        ls = [gpu.make("attention_prefill", (rows, nkv, n_splits), 128, *a),
              gpu.make("attention_combine", (rows, nq), hd, part_o, part_ml, do2, rows, nq, hd, n_splits)]
        ms_old = _time(gpu, ls, 2)
        old_out = R.f32(gpu.get(do2, BF16, (rows, nq * hd)))
        rel = np.linalg.norm(old_out - got) / np.linalg.norm(old_out)
        line += f"; before (attention_prefill+combine): {ms_old * 1e3:9.1f} us/layer, rel diff {rel:.1e}"
        assert rel < 1e-2
    print("\n" + line)


def _rows_reference(qkv, state, table, pos, sub, layer, nq, nkv, hd, pt):
    G = nq // nkv
    st = R.f32(state).astype(np.float64)
    out = np.zeros((len(sub), nq * hd))
    for i, r in enumerate(sub):
        t = np.arange(pos[r] + 1)
        pages = table[0, t // pt]
        for hq in range(nq):
            h = hq // G
            K, V = st[pages, layer, 0, h, t % pt], st[pages, layer, 1, h, t % pt]
            sc = K @ R.f32(qkv[r, hq * hd : (hq + 1) * hd]).astype(np.float64) / np.sqrt(hd)
            p = np.exp(sc - sc.max())
            out[i, hq * hd : (hq + 1) * hd] = (p / p.sum()) @ V
    return out
