"""Each llama kernel on the GPU against a numpy reference (bf16 rounding made explicit).
Outputs are poisoned before each run, so an unwritten element fails."""

import numpy as np
import pytest

from kern.runtime.devices.cuda import ParamLayoutError
from tests.cuda import cuda_refs as R
from tests.cuda.cuda_refs import BF16

pytestmark = pytest.mark.gpu


def bf(gpu, buf, shape):
    return R.f32(gpu.get(buf, BF16, shape))


def assert_near_bf16(got, ref, max_ulp=1, min_exact=0.99):
    d = R.ulp_diff(got, ref)
    assert not np.isnan(got).any(), "unwritten or NaN outputs"
    assert d.max() <= max_ulp, f"max {d.max()} bf16 ulps at {np.unravel_index(d.argmax(), d.shape)}"
    assert np.mean(d == 0) >= min_exact, f"only {np.mean(d == 0):.4f} exactly equal"


def test_every_kernel_loads_with_the_layout_its_table_entry_declares(gpu):
    from kern_models.llama.kernels.cuda.table import KERNELS

    for k in KERNELS:
        gpu.modules[k.module].kernel(k.entry, k.c_kinds())
    for entry in gpu.docs:  # and the test-only kernels, as their sources declare them
        gpu.kernel(entry)


def test_a_wrong_declaration_is_refused_naming_kernel_and_position(gpu):
    with pytest.raises(ParamLayoutError, match=r"kernel 'rms_norm' param 5: declared i64 \(8 bytes at offset 32\), cubin has 4 bytes at offset 32"):
        gpu.modules["norm"].kernel("rms_norm", ["ptr", "ptr", "ptr", "i32", "i32", "i64"])
    with pytest.raises(ParamLayoutError, match="declared 2 params, cubin has 6"):
        gpu.modules["norm"].kernel("rms_norm", ["ptr", "ptr"])
    with pytest.raises(ParamLayoutError, match="module 'norm' has no kernel 'nope'"):
        gpu.modules["norm"].kernel("nope", [])


def test_embed_and_gather_last(gpu):
    rng = np.random.default_rng(0)
    vocab, hidden, rows = 1000, 1024, 7
    W = R.rand_bf16(rng, (vocab, hidden))
    ids = rng.integers(0, vocab, rows).astype(np.int32)
    dx = gpu.empty(rows * hidden * 2)
    gpu.run("embed", rows, 256, gpu.put(ids), gpu.put(W), dx, rows, hidden)
    x = gpu.get(dx, BF16, (rows, hidden))
    assert np.array_equal(x.view(np.uint16), W[ids].view(np.uint16))
    cu = np.array([0, 3, 4, 7], np.int32)
    dy = gpu.empty(3 * hidden * 2)
    gpu.run("gather_last", 3, 256, dx, gpu.put(cu), dy, 3, hidden)
    assert np.array_equal(gpu.get(dy, BF16, (3, hidden)).view(np.uint16), x[[2, 3, 6]].view(np.uint16))


def test_rms_norm(gpu):
    rng = np.random.default_rng(1)
    rows, hidden, eps = 5, 2048, 1e-5
    x, w = R.rand_bf16(rng, (rows, hidden), 3.0), R.rand_bf16(rng, (hidden,))
    dy = gpu.empty(rows * hidden * 2)
    gpu.run("rms_norm", rows, 256, gpu.put(x), gpu.put(w), dy, rows, hidden, eps)
    assert_near_bf16(bf(gpu, dy, (rows, hidden)), R.rms_norm(x, w, eps))


def test_add_rms_norm_stores_the_rounded_residual_and_norms_it(gpu):
    rng = np.random.default_rng(2)
    rows, hidden, eps = 4, 576, 1e-6
    res, x, w = (R.rand_bf16(rng, (rows, hidden)), R.rand_bf16(rng, (rows, hidden)),
                 R.rand_bf16(rng, (hidden,)))
    dres, dy = gpu.put(res), gpu.empty(rows * hidden * 2)
    gpu.run("add_rms_norm", rows, 256, dres, gpu.put(x), gpu.put(w), dy, rows, hidden, eps)
    new_res = bf(gpu, dres, (rows, hidden))
    assert np.array_equal(new_res, R.rbf(R.f32(res) + R.f32(x)))
    assert_near_bf16(bf(gpu, dy, (rows, hidden)), R.rms_norm(new_res, w, eps))


@pytest.mark.parametrize("head_dim,theta,factor", [(64, 500000.0, 32.0), (128, 1000000.0, 0.0)])
def test_rope_table(gpu, head_dim, theta, factor):
    max_pos = 4096
    dt = gpu.empty(max_pos * head_dim * 4)
    gpu.run("rope_table", max_pos, head_dim // 2, dt, max_pos, head_dim, theta, factor, 1.0, 4.0, 8192)
    t = gpu.get(dt, np.float32, (max_pos, head_dim))
    ref = R.rope_table(max_pos, head_dim, R.inv_freq(head_dim, theta, factor, 1.0, 4.0, 8192))
    np.testing.assert_allclose(t, ref, rtol=1e-5, atol=5e-7)
    assert np.mean(R.rbf(t) == R.rbf(ref)) > 0.999


def _table(max_pos, head_dim):
    return R.rope_table(max_pos, head_dim, R.inv_freq(head_dim, 500000.0, 32.0, 1.0, 4.0, 8192))


def test_rope_on_a_fused_qkv_buffer(gpu):
    rng = np.random.default_rng(3)
    rows, nq, nkv, hd, max_pos = 6, 8, 2, 64, 4096
    width = (nq + 2 * nkv) * hd
    qkv = R.rand_bf16(rng, (rows, width))
    pos = rng.integers(0, max_pos, rows).astype(np.int32)
    table = _table(max_pos, hd)
    d = gpu.put(qkv)
    gpu.run("rope", (rows, nq + nkv), hd // 2, d.ptr, d.ptr + nq * hd * 2, gpu.put(pos),
            gpu.put(table), rows, nq, nkv, hd, width, width)
    out = bf(gpu, d, (rows, width))
    q = R.f32(qkv[:, : nq * hd]).reshape(rows, nq, hd)
    k = R.f32(qkv[:, nq * hd : (nq + nkv) * hd]).reshape(rows, nkv, hd)
    assert np.array_equal(out[:, : nq * hd], R.rope_heads(q, pos, table).reshape(rows, -1))
    assert np.array_equal(out[:, nq * hd : (nq + nkv) * hd], R.rope_heads(k, pos, table).reshape(rows, -1))
    assert np.array_equal(out[:, (nq + nkv) * hd :], R.f32(qkv[:, (nq + nkv) * hd :]))  # v untouched


def test_qk_norm_rope(gpu):
    rng = np.random.default_rng(4)
    rows, nq, nkv, hd, eps, max_pos = 5, 4, 2, 128, 1e-6, 2048
    q, k = R.rand_bf16(rng, (rows, nq * hd), 2.0), R.rand_bf16(rng, (rows, nkv * hd), 2.0)
    qw, kw = R.rand_bf16(rng, (hd,)), R.rand_bf16(rng, (hd,))
    pos = rng.integers(0, max_pos, rows).astype(np.int32)
    table = _table(max_pos, hd)
    dq, dk = gpu.put(q), gpu.put(k)
    gpu.run("qk_norm_rope", (rows, nq + nkv), hd // 2, dq, dk, gpu.put(qw), gpu.put(kw), gpu.put(pos),
            gpu.put(table), rows, nq, nkv, hd, nq * hd, nkv * hd, eps)
    for dbuf, src, n, w in ((dq, q, nq, qw), (dk, k, nkv, kw)):
        normed = R.rms_norm(R.f32(src).reshape(rows, n, hd), w, eps)
        ref = R.rope_heads(normed, pos, table).reshape(rows, -1)
        assert_near_bf16(bf(gpu, dbuf, (rows, n * hd)), ref, max_ulp=2, min_exact=0.97)


# ---- paged KV: append and attention ----------------------------------------------------

def _kv_view(state_u16, n_layers, nkv, pt, hd):
    return state_u16.reshape(-1, n_layers, 2, nkv, pt, hd)


def test_kv_append_writes_the_documented_page_layout(gpu):
    rng = np.random.default_rng(5)
    n_layers, layer, nkv, hd, pt, pps, nq = 3, 1, 2, 64, 16, 4, 4
    pos = np.concatenate([np.arange(5, 25), np.arange(30, 33)]).astype(np.int32)
    cu = np.array([0, 20, 23], np.int32)
    rows, n_seqs = len(pos), 2
    n_pages = 10
    page_table = rng.permutation(n_pages)[: n_seqs * pps].astype(np.int32).reshape(n_seqs, pps)
    width = (nq + 2 * nkv) * hd
    qkv = R.rand_bf16(rng, (rows, width))
    state = rng.integers(0, 2**16, n_pages * pt * n_layers * 2 * nkv * hd, dtype=np.uint16)
    dstate, dqkv = gpu.put(state), gpu.put(qkv)
    gpu.run("kv_append", (rows, nkv), 32, dqkv.ptr + nq * hd * 2, dqkv.ptr + (nq + nkv) * hd * 2,
            dstate, gpu.put(page_table), gpu.put(cu), gpu.put(pos), pps, rows, n_seqs, layer,
            n_layers, nkv, hd, pt, width)
    ref = _kv_view(state.copy(), n_layers, nkv, pt, hd)
    kv = qkv.view(np.uint16)
    for r in range(rows):
        s = 0 if r < cu[1] else 1
        phys = page_table[s, pos[r] // pt]
        for h in range(nkv):
            ref[phys, layer, 0, h, pos[r] % pt] = kv[r, (nq + h) * hd : (nq + h + 1) * hd]
            ref[phys, layer, 1, h, pos[r] % pt] = kv[r, (nq + nkv + h) * hd : (nq + nkv + h + 1) * hd]
    got = gpu.get(dstate, np.uint16, state.shape)
    assert np.array_equal(got, ref.reshape(-1))


def _paged_state(rng, n_seqs, pps, n_layers, nkv, pt, hd):
    n_pages = n_seqs * pps + 3
    page_table = rng.permutation(n_pages)[: n_seqs * pps].astype(np.int32).reshape(n_seqs, pps)
    state = R.rand_bf16(rng, (n_pages, n_layers, 2, nkv, pt, hd))
    return page_table, state


def _attention_ref(q, state, page_table, seq_of_row, pos, layer, nq, nkv, hd, pt):
    rows, G = len(pos), nq // nkv
    out = np.zeros((rows, nq * hd))
    st = state.astype(np.float64)
    for r in range(rows):
        s, n = seq_of_row[r], pos[r] + 1
        t = np.arange(n)
        pages = page_table[s, t // pt]
        for hq in range(nq):
            h = hq // G
            K = st[pages, layer, 0, h, t % pt]
            V = st[pages, layer, 1, h, t % pt]
            sc = K @ q[r, hq * hd : (hq + 1) * hd].astype(np.float64) / np.sqrt(hd)
            p = np.exp(sc - sc.max())
            out[r, hq * hd : (hq + 1) * hd] = (p / p.sum()) @ V
    return out


@pytest.mark.parametrize("nq,nkv,hd", [(8, 2, 128), (6, 2, 64), (4, 4, 64), (9, 3, 64), (32, 8, 64),
                                      (32, 4, 128), (4, 1, 128)])
@pytest.mark.parametrize("split_tokens", [64, 4096])
def test_attention_decode_merges_its_own_splits(gpu, nq, nkv, hd, split_tokens):
    """One launch: rows with one split write o directly, rows with several merge in the last
    block to arrive; the split counters are back at zero afterwards."""
    rng = np.random.default_rng(6)
    n_layers, layer, pt, pps = 2, 1, 16, 20
    pos = np.array([0, 37, 300], np.int32)
    rows = len(pos)
    page_table, state = _paged_state(rng, rows, pps, n_layers, nkv, pt, hd)
    width = (nq + 2 * nkv) * hd
    qkv = R.rand_bf16(rng, (rows, width), 2.0)
    n_splits = -(-(pps * pt) // split_tokens)  # the grid covers the whole table; most blocks idle
    part_o, part_ml = gpu.empty(rows * nq * n_splits * hd * 4), gpu.empty(rows * nq * n_splits * 2 * 4)
    sem = gpu.put(np.zeros(rows * nkv, np.int32))
    do = gpu.empty(rows * nq * hd * 2)
    args = (gpu.put(qkv), gpu.put(state), gpu.put(page_table), gpu.put(pos), part_o, part_ml, sem, do,
            rows, pps, layer, n_layers, nq, nkv, hd, pt, split_tokens, width)
    gpu.run("attention_decode", (rows, nkv, n_splits), 128, *args)
    out = bf(gpu, do, (rows, nq * hd))
    ref = _attention_ref(R.f32(qkv), R.f32(state), page_table, np.arange(rows), pos, layer, nq, nkv, hd, pt)
    np.testing.assert_allclose(out, ref, atol=1e-2, rtol=1e-2)
    assert not gpu.get(sem, np.int32, rows * nkv).any()
    first = out.copy()  # deterministic: a second run gives the same bits
    for _ in range(3):
        gpu.run("attention_decode", (rows, nkv, n_splits), 128, *args)
        assert np.array_equal(bf(gpu, do, (rows, nq * hd)), first)


@pytest.mark.parametrize("nq,nkv,hd,groups", [(32, 4, 128, 2), (16, 2, 64, 4), (8, 1, 128, 8)])
def test_attention_decode_head_groups_give_the_same_bits(gpu, nq, nkv, hd, groups):
    """A kv head's query heads split over `groups` blocks (grid y = n_kv_heads * groups): every
    output bit as one block a kv head, with and without a split merge; the counters end at zero."""
    rng = np.random.default_rng(9)
    n_layers, layer, pt, pps, split_tokens = 2, 0, 16, 20, 128
    pos = np.array([5, 160, 319], np.int32)
    rows = len(pos)
    page_table, state = _paged_state(rng, rows, pps, n_layers, nkv, pt, hd)
    width = (nq + 2 * nkv) * hd
    qkv, state_d, table_d, pos_d = gpu.put(R.rand_bf16(rng, (rows, width), 2.0)), gpu.put(state), \
        gpu.put(page_table), gpu.put(pos)
    n_splits = -(-(pps * pt) // split_tokens)
    outs = []
    for g in (1, groups):
        part_o, part_ml = gpu.empty(rows * nq * n_splits * hd * 4), gpu.empty(rows * nq * n_splits * 2 * 4)
        sem, do = gpu.put(np.zeros(rows * nq, np.int32)), gpu.empty(rows * nq * hd * 2)
        gpu.run("attention_decode", (rows, nkv * g, n_splits), 128, qkv, state_d, table_d, pos_d, part_o, part_ml,
                sem, do, rows, pps, layer, n_layers, nq, nkv, hd, pt, split_tokens, width)
        outs.append(bf(gpu, do, (rows, nq * hd)))
        assert not gpu.get(sem, np.int32, rows * nq).any()
    assert np.array_equal(outs[0], outs[1])


def test_attention_prefill_chunked_over_a_cached_prefix(gpu):
    rng = np.random.default_rng(7)
    nq, nkv, hd, n_layers, layer, pt, pps = 8, 2, 64, 1, 0, 16, 4
    pos = np.concatenate([np.arange(10, 30), np.arange(0, 5)]).astype(np.int32)
    cu = np.array([0, 20, 25], np.int32)
    rows, n_seqs = len(pos), 2
    seq_of_row = np.array([0] * 20 + [1] * 5)
    page_table, state = _paged_state(rng, n_seqs, pps, n_layers, nkv, pt, hd)
    q = R.rand_bf16(rng, (rows, nq * hd), 2.0)
    ref = _attention_ref(R.f32(q), R.f32(state), page_table, seq_of_row, pos, layer, nq, nkv, hd, pt)
    for split_tokens in (16, 64):
        n_splits = -(-30 // split_tokens)
        part_o, part_ml = gpu.empty(rows * nq * n_splits * hd * 4), gpu.empty(rows * nq * n_splits * 8)
        do = gpu.empty(rows * nq * hd * 2)
        gpu.run("attention_prefill", (rows, nkv, n_splits), 128, gpu.put(q), gpu.put(state),
                gpu.put(page_table), gpu.put(cu), gpu.put(pos), part_o, part_ml, do, rows, n_seqs,
                pps, layer, n_layers, nq, nkv, hd, pt, split_tokens, nq * hd)
        if n_splits > 1:
            gpu.run("attention_combine", (rows, nq), hd, part_o, part_ml, do, rows, nq, hd, n_splits)
        np.testing.assert_allclose(bf(gpu, do, (rows, nq * hd)), ref, atol=1e-2, rtol=1e-2)


# ---- MLP, projections, sampling -------------------------------------------------------

def test_silu_mul(gpu):
    rng = np.random.default_rng(8)
    rows, inter = 3, 4096 + 8
    gu = R.rand_bf16(rng, (rows, 2 * inter), 3.0)
    dh = gpu.empty(rows * inter * 2)
    gpu.run("silu_mul", (rows, -(-inter // 2048)), 256, gpu.put(gu), dh, rows, inter)
    g, u = R.f32(gu[:, :inter]).astype(np.float64), R.f32(gu[:, inter:])
    ref = R.rbf(R.rbf(g / (1 + np.exp(-g))) * u)
    assert_near_bf16(bf(gpu, dh, (rows, inter)), ref)


@pytest.mark.parametrize("rows,N,K", [(1, 1000, 2048), (5, 1000, 2048), (11, 1000, 2048), (16, 1000, 2048),
                                      (32, 1000, 2048), (40, 1000, 2048), (1, 200, 576), (16, 200, 576),
                                      (3, 72, 8192), (2, 24, 8)])
def test_gemv(gpu, rows, N, K):
    rng = np.random.default_rng(9)
    x, W = R.rand_bf16(rng, (rows, K)), R.rand_bf16(rng, (N, K), 0.05)
    ref = R.f32(x).astype(np.float64) @ R.f32(W).astype(np.float64).T
    bound = np.abs(R.f32(x)).astype(np.float64) @ np.abs(R.f32(W)).astype(np.float64).T
    dx, dW = gpu.put(x), gpu.put(W)
    dy32, dy16 = gpu.empty(rows * N * 4), gpu.empty(rows * N * 2)
    gpu.run("gemv_f32", -(-N // 16), 256, dx, dW, dy32, rows, N, K)
    gpu.run("gemv_bf16", -(-N // 16), 256, dx, dW, dy16, rows, N, K)
    y32 = gpu.get(dy32, np.float32, (rows, N))
    assert np.all(np.abs(y32 - ref) <= 1e-5 * bound + 1e-6)
    assert_near_bf16(bf(gpu, dy16, (rows, N)), R.rbf(ref), min_exact=0.98)
    # deterministic, and each row independent of the others in the batch
    gpu.run("gemv_f32", -(-N // 16), 256, dx, dW, dy32, rows, N, K)
    assert np.array_equal(gpu.get(dy32, np.float32, (rows, N)), y32)
    d1 = gpu.empty(N * 4)
    gpu.run("gemv_f32", -(-N // 16), 256, gpu.put(x[rows - 1:]), dW, d1, 1, N, K)
    assert np.array_equal(gpu.get(d1, np.float32, (1, N))[0], y32[rows - 1])


def test_norm_gemv_is_as_close_to_exact_as_rms_norm_then_gemv(gpu):
    """The fused norm scales the row's sums by 1/rms after the mma (x = bf16(nw * res) in it):
    one rounding of x where the unfused pair has two. Not the same bits, so it is judged
    against the exact (float64) result beside the unfused pair."""
    rng = np.random.default_rng(11)
    eps = 1e-5
    for rows, N, K in ((1, 3072, 2048), (16, 200, 576), (40, 72, 960)):
        res, nw, W = (R.rand_bf16(rng, (rows, K), 3.0), R.rand_bf16(rng, (K,)),
                      R.rand_bf16(rng, (N, K), 0.05))
        r64, w64 = R.f32(res).astype(np.float64), R.f32(nw).astype(np.float64)
        exact = (r64 / np.sqrt(np.mean(r64 ** 2, 1, keepdims=True) + eps) * w64) @ R.f32(W).astype(np.float64).T
        dres, dnw, dW = gpu.put(res), gpu.put(nw), gpu.put(W)
        dh, y_ref, y32 = gpu.empty(rows * K * 2), gpu.empty(rows * N * 4), gpu.empty(rows * N * 4)
        gpu.run("rms_norm", rows, 256, dres, dnw, dh, rows, K, eps)
        gpu.run("gemv_f32", -(-N // 16), 256, dh, dW, y_ref, rows, N, K)
        gpu.run("norm_gemv_f32", -(-N // 16), 256, dres, dnw, dW, y32, rows, N, K, eps)
        fused, unfused = gpu.get(y32, np.float32, (rows, N)), gpu.get(y_ref, np.float32, (rows, N))
        err_f, err_u = np.abs(fused - exact), np.abs(unfused - exact)
        scale = np.abs(exact).max()
        assert err_f.max() <= 1.5 * err_u.max() + 1e-6 * scale, (err_f.max(), err_u.max())
        assert err_f.mean() <= 1.5 * err_u.mean() + 1e-7 * scale, (err_f.mean(), err_u.mean())
        # the bf16 entry stores the same sums rounded; every block takes the same 1/rms
        y = gpu.empty(rows * N * 2)
        gpu.run("norm_gemv_bf16", -(-N // 16), 256, dres, dnw, dW, y, rows, N, K, eps)
        assert np.array_equal(R.rbf(fused), bf(gpu, y, (rows, N)))
        # and a row's result does not depend on the other rows of the batch
        gpu.run("norm_gemv_f32", -(-N // 16), 256, gpu.put(res[rows - 1:]), dnw, dW, y32, 1, N, K, eps)
        assert np.array_equal(gpu.get(y32, np.float32, (1, N))[0], fused[rows - 1])


def test_gemv_residual_adds_the_rounded_projection_into_the_residual(gpu):
    rng = np.random.default_rng(12)
    for rows, N, K in ((1, 2048, 8192), (16, 576, 1536), (33, 64, 256)):
        x, W, res = R.rand_bf16(rng, (rows, K)), R.rand_bf16(rng, (N, K), 0.05), R.rand_bf16(rng, (rows, N))
        dx, dW = gpu.put(x), gpu.put(W)
        y, dres = gpu.empty(rows * N * 2), gpu.put(res)
        gpu.run("gemv_bf16", -(-N // 16), 256, dx, dW, y, rows, N, K)
        gpu.run("gemv_residual", -(-N // 16), 256, dx, dW, dres, rows, N, K)
        assert np.array_equal(bf(gpu, dres, (rows, N)), R.rbf(R.f32(res) + bf(gpu, y, (rows, N))))


def test_norm_gemv_swiglu_equals_norm_gemv_then_silu_mul(gpu):
    rng = np.random.default_rng(14)
    eps = 1e-5
    for rows, inter, K in ((1, 8192, 2048), (16, 1536, 576), (33, 104, 256)):
        res, nw = R.rand_bf16(rng, (rows, K), 3.0), R.rand_bf16(rng, (K,))
        W = R.rand_bf16(rng, (2 * inter, K), 0.05)
        dres, dnw, dW = gpu.put(res), gpu.put(nw), gpu.put(W)
        gu, act_ref, act = gpu.empty(rows * 2 * inter * 2), gpu.empty(rows * inter * 2), gpu.empty(rows * inter * 2)
        gpu.run("norm_gemv_bf16", -(-2 * inter // 16), 256, dres, dnw, dW, gu, rows, 2 * inter, K, eps)
        gpu.run("silu_mul", (rows, -(-inter // 2048)), 256, gu, act_ref, rows, inter)
        gpu.run("norm_gemv_swiglu", -(-inter // 8), 256, dres, dnw, dW, act, rows, inter, K, eps)
        assert np.array_equal(gpu.get(act, np.uint16, (rows, inter)), gpu.get(act_ref, np.uint16, (rows, inter)))


def test_qk_norm_rope_append_equals_qk_norm_rope_then_kv_append(gpu):
    rng = np.random.default_rng(13)
    n_layers, layer, nq, nkv, hd, pt, pps, max_pos, eps = 2, 1, 8, 2, 128, 16, 4, 64, 1e-6
    pos = np.array([5, 63, 17], np.int32)
    rows = n_seqs = len(pos)
    cu = np.arange(rows + 1, dtype=np.int32)
    n_pages = n_seqs * pps + 2
    page_table = rng.permutation(n_pages)[: n_seqs * pps].astype(np.int32).reshape(n_seqs, pps)
    width = (nq + 2 * nkv) * hd
    qkv = R.rand_bf16(rng, (rows, width), 2.0)
    qw, kw = R.rand_bf16(rng, (hd,)), R.rand_bf16(rng, (hd,))
    state = rng.integers(0, 2**16, n_pages * pt * n_layers * 2 * nkv * hd, dtype=np.uint16)
    dtab = gpu.put(_table(max_pos, hd))
    dpt, dcu, dpos = gpu.put(page_table), gpu.put(cu), gpu.put(pos)
    outs = []
    for fused in (False, True):
        d, ds = gpu.put(qkv), gpu.put(state)
        q, k, v = d.ptr, d.ptr + nq * hd * 2, d.ptr + (nq + nkv) * hd * 2
        tail = (pps, rows, n_seqs, layer, n_layers, nq, nkv, hd, pt, width, width)
        if fused:
            gpu.run("qk_norm_rope_append", (rows, nq + nkv), hd // 2, q, k, v, gpu.put(qw), gpu.put(kw), ds,
                    dpt, dcu, dpos, dtab, *tail, eps)
        else:
            gpu.run("qk_norm_rope", (rows, nq + nkv), hd // 2, q, k, gpu.put(qw), gpu.put(kw), dpos, dtab,
                    rows, nq, nkv, hd, width, width, eps)
            gpu.run("kv_append", (rows, nkv), 32, k, v, ds, dpt, dcu, dpos, pps, rows, n_seqs, layer,
                    n_layers, nkv, hd, pt, width)
        outs.append((gpu.get(d, np.uint16, qkv.shape), gpu.get(ds, np.uint16, state.shape)))
    assert np.array_equal(outs[0][0], outs[1][0])
    assert np.array_equal(outs[0][1], outs[1][1])


@pytest.mark.parametrize("hd,nq,nkv,rows", [(64, 9, 3, 1), (64, 32, 8, 16), (128, 8, 2, 3)])
def test_norm_gemv_rope_append_equals_norm_gemv_then_rope_then_kv_append(gpu, hd, nq, nkv, rows):
    """Decode's first launch of a layer: norm, qkv projection, rope and the KV append. Each
    block holds both halves of 8 rope pairs, so its epilogue rotates them in place."""
    rng = np.random.default_rng(16)
    n_layers, layer, pt, pps, max_pos, eps, K = 2, 1, 16, 4, 64, 1e-5, 576
    pos = rng.integers(0, max_pos, rows).astype(np.int32)
    cu = np.arange(rows + 1, dtype=np.int32)
    n_pages = rows * pps + 2
    page_table = rng.permutation(n_pages)[: rows * pps].astype(np.int32).reshape(rows, pps)
    N = (nq + 2 * nkv) * hd
    res, nw, W = R.rand_bf16(rng, (rows, K), 3.0), R.rand_bf16(rng, (K,)), R.rand_bf16(rng, (N, K), 0.05)
    state = rng.integers(0, 2**16, n_pages * pt * n_layers * 2 * nkv * hd, dtype=np.uint16)
    dtab = gpu.put(_table(max_pos, hd))
    dres, dnw, dW = gpu.put(res), gpu.put(nw), gpu.put(W)
    dpt, dcu, dpos = gpu.put(page_table), gpu.put(cu), gpu.put(pos)
    outs = []
    for fused in (False, True):
        d, ds = gpu.empty(rows * N * 2), gpu.put(state)
        if fused:
            gpu.run("norm_gemv_rope_append", N // 16, 256, dres, dnw, dW, d, ds, dpt, dcu, dpos, dtab, pps, rows,
                    rows, layer, n_layers, nq, nkv, hd, pt, N, K, eps)
        else:
            gpu.run("norm_gemv_bf16", N // 16, 256, dres, dnw, dW, d, rows, N, K, eps)
            q, k, v = d.ptr, d.ptr + nq * hd * 2, d.ptr + (nq + nkv) * hd * 2
            gpu.run("rope", (rows, nq + nkv), hd // 2, q, k, dpos, dtab, rows, nq, nkv, hd, N, N)
            gpu.run("kv_append", (rows, nkv), 32, k, v, ds, dpt, dcu, dpos, pps, rows, rows, layer, n_layers,
                    nkv, hd, pt, N)
        outs.append((gpu.get(d, np.uint16, (rows, N)), gpu.get(ds, np.uint16, state.shape)))
    assert np.array_equal(outs[0][0], outs[1][0]), "q, k, v in the qkv buffer"
    assert np.array_equal(outs[0][1], outs[1][1]), "the paged KV state"


def test_argmax_ties_go_to_the_lowest_index(gpu):
    rng = np.random.default_rng(10)
    n_rows, vocab, chunks = 4, 50021, 128
    logits = rng.standard_normal((n_rows, vocab)).astype(np.float32)
    logits[0, [123, 40000]] = 50.0  # tie across chunks
    logits[1, vocab - 1] = 50.0  # the very last index
    logits[2, :] = 1.0  # all equal
    logits[3, ::7] = np.nan  # NaN never wins
    logits[3, 999] = 50.0
    pv, pi, tok = gpu.empty(n_rows * chunks * 4), gpu.empty(n_rows * chunks * 4), gpu.empty(n_rows * 4)
    greedy, keys = gpu.put(np.zeros(n_rows, np.float32)), gpu.put(np.zeros((n_rows, 2), np.int32))
    gpu.run("sample_partial", (chunks, n_rows), 256, gpu.put(logits), greedy, keys, *_unmasked(gpu, n_rows, vocab), pv, pi,
            vocab, n_rows, chunks)
    gpu.run("argmax_final", n_rows, 32, pv, pi, tok, n_rows, chunks)
    assert gpu.get(tok, np.int32, n_rows).tolist() == [123, vocab - 1, 0, 999]


def _unmasked(gpu, n_rows: int, vocab: int) -> tuple:
    """sample_partial's mask inputs for rows drawn over every token: one row of words, no row masked."""
    return gpu.put(np.zeros((1, -(-vocab // 32)), np.int32)), gpu.put(np.zeros(n_rows, np.int32))


def test_a_token_leading_by_100_nats_is_drawn_in_every_one_of_100000_draws(gpu):
    """sample_partial's Gumbel noise stays finite: u strictly inside (0, 1) in float32. (With 24
    random bits the largest u rounded up to 1.0, its noise was +inf and that token won whatever
    its logit: 16 of these 100,000 draws did, by the cpu op of the same formula.)"""
    draws, n_rows, vocab, chunks, best = 100_000, 10_000, 2048, 16, 5
    logits = np.zeros((n_rows, vocab), np.float32)
    logits[:, best] = 100.0
    temps = gpu.put(np.ones(n_rows, np.float32))
    d_logits = gpu.put(logits)
    pv, pi, tok = gpu.empty(n_rows * chunks * 4), gpu.empty(n_rows * chunks * 4), gpu.empty(n_rows * 4)
    rng = np.random.default_rng(12)
    free = _unmasked(gpu, n_rows, vocab)
    for start in range(0, draws, n_rows):
        keys = gpu.put(rng.integers(-2**31, 2**31, (n_rows, 2)).astype(np.int32))
        gpu.run("sample_partial", (chunks, n_rows), 256, d_logits, temps, keys, *free, pv, pi, vocab, n_rows, chunks)
        gpu.run("argmax_final", n_rows, 32, pv, pi, tok, n_rows, chunks)
        got = gpu.get(tok, np.int32, n_rows)
        assert (got == best).all(), f"draw {start + int(np.argmax(got != best))} took token {got[got != best][0]}"


def test_a_temperature_draw_is_the_cpu_references_draw_and_follows_the_softmax(gpu):
    """sample_partial at T > 0 draws what the cpu op draws for the same key (one formula; a
    flip needs a near-tie of logit / T + noise), and over many keys the draws follow
    softmax(logits / T)."""
    from kern_models.llama.kernels.cpu.kernels import sample

    rng = np.random.default_rng(11)
    n_rows, vocab, chunks, t = 2000, 8, 4, 0.7
    logits = np.tile(rng.standard_normal(vocab).astype(np.float32), (n_rows, 1))
    temps = np.full(n_rows, t, np.float32)
    keys = rng.integers(-2**31, 2**31, (n_rows, 2)).astype(np.int32)
    pv, pi, tok = gpu.empty(n_rows * chunks * 4), gpu.empty(n_rows * chunks * 4), gpu.empty(n_rows * 4)
    gpu.run("sample_partial", (chunks, n_rows), 256, gpu.put(logits), gpu.put(temps), gpu.put(keys),
            *_unmasked(gpu, n_rows, vocab), pv, pi, vocab, n_rows, chunks)
    gpu.run("argmax_final", n_rows, 32, pv, pi, tok, n_rows, chunks)
    got = gpu.get(tok, np.int32, n_rows)
    want = np.empty(n_rows, np.int32)
    sample(logits, temps, keys, np.zeros((1, -(-vocab // 32)), np.int32), np.zeros(n_rows, np.int32), want)
    assert np.mean(got != want) < 0.002
    p = np.exp(logits[0] / t - np.max(logits[0] / t))
    p /= p.sum()
    counts = np.bincount(got, minlength=vocab)
    chi2 = float(np.sum((counts - n_rows * p) ** 2 / (n_rows * p)))
    assert chi2 < 24.3, f"chi-square {chi2:.1f} over {vocab - 1} degrees of freedom (p = 0.001 at 24.3)"
