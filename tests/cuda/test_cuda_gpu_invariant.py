"""The kernels behind sm_90a's batch invariance (docs/determinism.md), on the GPU, bit for bit:
each gemm twin (gemm.cu on wgmma: prefill's projections; its split variant: the wide decode's)
gives every row the bytes its gemv kernel (the decode program's) gives it, at any number of rows
and for every projection shape of the llama family; attention_rows (prefill) gives a prompt row
the bytes attention_decode gives the same token decoded.

The kernels run as the manifest's ops run them (table.ops(): a normed twin is rms_prep then the
GEMM, with its scratch), so what is checked is what a program launches."""

import numpy as np
import pytest

from kern.runtime.devices.cuda.launch import launch
from kern_models.llama.kernels.cuda import table
from tests.cuda import cuda_refs as R
from tests.cuda.cuda_gpu import op_launches
from tests.cuda.test_cuda_gpu_kernels import _paged_state, _table

pytestmark = pytest.mark.gpu

EPS = 1e-5
OPS = table.ops()
# (rows, N, K): K of less than a unit (256), a partial last unit (576 = 2.25 units), one unit a
# partial (2048), four (8192); rows past one 64-row block (the split's) and one 128-row block
# (prefill's), N past one tile of either
SHAPES = [(1, 64, 200), (5, 960, 576), (70, 1536, 576), (37, 2048, 2048), (130, 200, 8192), (259, 1040, 1024)]


def run_op(gpu, op: str, named: dict) -> None:
    """Runs manifest op `op` with its parameters bound by name (cuda_gpu.op_launches), then
    checks the split counters are back at zero."""
    named = dict(named)
    for la in op_launches(gpu, OPS[op], named):
        launch(la, gpu.stream)
    gpu.stream.synchronize()
    if "sem" in named:
        assert not gpu.get(named["sem"], np.int32, named["sem"].nbytes // 4).any(), \
            f"{op}: the split counters are back at zero"


def _both(gpu, gemv: str, gemm: str, rows: int, out_of) -> None:
    """The gemv op over `rows` rows, the gemm twin and its split variant over them, then the twin
    over single rows: the same bytes everywhere. out_of(op, n, r0) runs an op over rows
    r0 .. r0 + n (at the start of fresh buffers) and returns its outputs, the rows' first."""
    ref = out_of(gemv, rows, 0)
    got = out_of(gemm, rows, 0)
    for a, b in zip(ref, got):
        assert np.array_equal(a, b), f"{gemm} at {rows} rows != {gemv}"
    if gemm + "_split" in OPS:
        for a, c in zip(ref, out_of(gemm + "_split", rows, 0)):
            assert np.array_equal(a, c), f"{gemm}_split at {rows} rows != {gemv}"
    for r in sorted({0, rows // 2, rows - 1}):
        alone = out_of(gemm, 1, r)
        assert np.array_equal(alone[0][0], got[0][r]), f"{gemm}: row {r} alone != row {r} of {rows}"


@pytest.mark.parametrize("rows,N,K", SHAPES)
def test_norm_gemm_and_gemm_residual_give_each_row_the_gemv_bytes(gpu, rows, N, K):
    rng = np.random.default_rng(rows + N + K)
    res, nw, W = R.rand_bf16(rng, (rows, K), 3.0), R.rand_bf16(rng, (K,)), R.rand_bf16(rng, (N, K), 0.05)
    x, base = R.rand_bf16(rng, (rows, K), 2.0), R.rand_bf16(rng, (rows, N), 4.0)
    dnw, dW = gpu.put(nw), gpu.put(W)

    def normed(op, n, r0, dtype=np.uint16):
        y = gpu.empty(n * N * np.dtype(dtype).itemsize)
        run_op(gpu, op, dict(res=gpu.put(res[r0:r0 + n]), nw=dnw, W=dW, y=y, rows=n, N=N, K=K, eps=EPS))
        return (gpu.get(y, dtype, (n, N)),)
    _both(gpu, "norm_gemv", "norm_gemm", rows, normed)
    # the f32 LM head has no split variant (its vocabulary gives blocks enough)
    _both(gpu, "norm_gemv_logits", "norm_gemm_logits", rows, lambda op, n, r0: normed(op, n, r0, np.uint32))

    def residual(op, n, r0):
        y = gpu.put(base[r0:r0 + n])
        run_op(gpu, op, dict(x=gpu.put(x[r0:r0 + n]), W=dW, res=y, rows=n, N=N, K=K))
        return (gpu.get(y, np.uint16, (n, N)),)
    _both(gpu, "gemv_residual", "gemm_residual", rows, residual)


@pytest.mark.parametrize("rows,inter,K", [(3, 1536, 576), (100, 104, 2048)])
def test_norm_gemm_swiglu_gives_each_row_the_gemv_bytes(gpu, rows, inter, K):
    rng = np.random.default_rng(14)
    res, nw = R.rand_bf16(rng, (rows, K), 3.0), R.rand_bf16(rng, (K,))
    dnw, dW = gpu.put(nw), gpu.put(R.rand_bf16(rng, (2 * inter, K), 0.05))

    def out_of(op, n, r0):
        act = gpu.empty(n * inter * 2)
        run_op(gpu, op, dict(res=gpu.put(res[r0:r0 + n]), nw=dnw, W=dW, act=act, rows=n, N=inter, K=K, eps=EPS))
        return (gpu.get(act, np.uint16, (n, inter)),)
    _both(gpu, "norm_gemv_swiglu", "norm_gemm_swiglu", rows, out_of)


@pytest.mark.parametrize("hd,nq,nkv,rows", [(64, 9, 3, 1), (64, 9, 3, 77), (128, 8, 2, 20), (128, 32, 8, 150)])
def test_norm_gemm_rope_append_gives_each_row_the_gemv_bytes(gpu, hd, nq, nkv, rows):
    rng = np.random.default_rng(16)
    n_layers, layer, pt, pps, max_pos, K = 2, 1, 16, 4, 64, 576
    pos = rng.integers(0, max_pos, rows).astype(np.int32)
    n_pages = rows * pps + 2
    page_table = rng.permutation(n_pages)[: rows * pps].astype(np.int32).reshape(rows, pps)
    N = (nq + 2 * nkv) * hd
    res, nw, W = R.rand_bf16(rng, (rows, K), 3.0), R.rand_bf16(rng, (K,)), R.rand_bf16(rng, (N, K), 0.05)
    state = rng.integers(0, 2**16, n_pages * pt * n_layers * 2 * nkv * hd, dtype=np.uint16)
    dtab, dnw, dW = gpu.put(_table(max_pos, hd)), gpu.put(nw), gpu.put(W)

    def out_of(op, n, r0):  # rows r0 .. r0 + n as sequences of one row each
        d, ds = gpu.empty(n * N * 2), gpu.put(state)
        cu = np.arange(n + 1, dtype=np.int32)
        run_op(gpu, op, dict(res=gpu.put(res[r0:r0 + n]), nw=dnw, W=dW, y=d, kv_state=ds,
                             page_table=gpu.put(page_table[r0:r0 + n]), cu_seqlens=gpu.put(cu),
                             pos=gpu.put(pos[r0:r0 + n]), table=dtab, pages_per_seq=pps, rows=n, n_seqs=n,
                             layer=layer, n_layers=n_layers, n_q_heads=nq, n_kv_heads=nkv, head_dim=hd,
                             page_tokens=pt, N=N, K=K, eps=EPS))
        return gpu.get(d, np.uint16, (n, N)), gpu.get(ds, np.uint16, state.shape)
    _both(gpu, "norm_gemv_rope_append", "norm_gemm_rope_append", rows, out_of)


# Every projection shape of the llama family's models: (model, name, N, K, normed)
FAMILY_SHAPES = [
    ("smollm2-135m", "qkv", 960, 576, True), ("smollm2-135m", "o", 576, 576, False),
    ("smollm2-135m", "gate_up", 3072, 576, True), ("smollm2-135m", "down", 576, 1536, False),
    ("llama-3.2-1b", "qkv", 3072, 2048, True), ("llama-3.2-1b", "o", 2048, 2048, False),
    ("llama-3.2-1b", "gate_up", 16384, 2048, True), ("llama-3.2-1b", "down", 2048, 8192, False),
    ("llama-3.1-8b", "qkv", 6144, 4096, True), ("llama-3.1-8b", "o", 4096, 4096, False),
    ("llama-3.1-8b", "gate_up", 28672, 4096, True), ("llama-3.1-8b", "down", 4096, 14336, False),
    ("qwen3-8b", "gate_up", 24576, 4096, True), ("qwen3-8b", "down", 4096, 12288, False),
]
SWEEP_ROWS = (1, 2, 8, 9, 33, 64, 65, 128, 129, 511, 2048, 8192)


def _tiled(rng, shape, scale):
    """Random bf16 without drawing every element (a random block tiled): fast at 8B shapes."""
    n = int(np.prod(shape))
    return np.resize(R.rand_bf16(rng, (min(n, 1 << 21) + 7,), scale), n).reshape(shape)


@pytest.mark.parametrize("model,name,N,K,normed", FAMILY_SHAPES, ids=[f"{m}-{n}" for m, n, *_ in FAMILY_SHAPES])
def test_a_row_has_the_same_bits_at_every_row_count(gpu, model, name, N, K, normed):
    """Eight probe rows, decoded by the gemv (the decode program's rows), then placed among
    M - 8 other rows (first, middle, last) for every M of SWEEP_ROWS through the gemm twin (and
    its split variant up to the wide decode's 256 rows): every probe row's bits are the gemv's."""
    rng = np.random.default_rng(N + K)
    W, nw = gpu.put(_tiled(rng, (N, K), 0.05)), gpu.put(R.rand_bf16(rng, (K,)))
    probe = R.rand_bf16(rng, (8, K), 3.0)
    base = R.rand_bf16(rng, (1, N), 2.0)  # every row's residual: a row's sum depends on its x alone

    def run(op, x):
        n = len(x)
        if normed:
            y = gpu.empty(n * N * 2)
            run_op(gpu, op, dict(res=gpu.put(x), nw=nw, W=W, y=y, rows=n, N=N, K=K, eps=EPS))
        else:
            y = gpu.put(np.repeat(base, n, axis=0))
            run_op(gpu, op, dict(x=gpu.put(x), W=W, res=y, rows=n, N=N, K=K))
        return gpu.get(y, np.uint16, (n, N))

    gemv_op, gemm_op = ("norm_gemv", "norm_gemm") if normed else ("gemv_residual", "gemm_residual")
    want = run(gemv_op, probe)
    others = _tiled(rng, (max(SWEEP_ROWS), K), 3.0)
    for M in SWEEP_ROWS:
        k = min(8, M)
        for at in sorted({0, max(0, M // 2 - 4), M - k}):
            x = others[:M].copy()
            x[at:at + k] = probe[:k]
            for op in (gemm_op, gemm_op + "_split") if M <= 256 else (gemm_op,):
                got = run(op, x)[at:at + k]
                bad = np.flatnonzero((got != want[:k]).any(axis=1))
                assert not len(bad), f"{model} {name} {op}: M={M}, probe row {bad[0]} at {at + bad[0]} differs"


@pytest.mark.parametrize("nq,nkv,hd", [(9, 3, 64), (32, 8, 64), (8, 2, 128), (32, 4, 128)])
@pytest.mark.parametrize("split_tokens", [128, 64])
def test_attention_rows_gives_a_prompt_row_the_bytes_of_the_token_decoded(gpu, nq, nkv, hd, split_tokens):
    """Three prompts packed as prefill rows (cu_seqlens), every position of each, against the
    same tokens as decode rows (one a sequence, its page-table row, its position) at both ends of
    decode's head grouping: one split, several, a last split of one token."""
    rng = np.random.default_rng(8)
    n_layers, layer, pt, pps = 2, 1, 16, 24
    lens = [5, split_tokens * 2 + 1, 300]
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    seq = np.repeat(np.arange(len(lens)), lens)
    pos = np.concatenate([np.arange(n) for n in lens]).astype(np.int32)
    rows = len(pos)
    page_table, state = _paged_state(rng, len(lens), pps, n_layers, nkv, pt, hd)
    width = (nq + 2 * nkv) * hd
    dq, dstate = gpu.put(R.rand_bf16(rng, (rows, width), 2.0)), gpu.put(state)
    pre = gpu.empty(rows * nq * hd * 2)
    gpu.run("attention_rows", (nq, -(-rows // 64) + len(lens)), 128, dq, dstate, gpu.put(page_table), gpu.put(cu), gpu.put(pos), pre,
            rows, len(lens), pps, layer, n_layers, nq, nkv, hd, pt, split_tokens, width)
    n_splits = -(-int(pos.max() + 1) // split_tokens)
    got = gpu.get(pre, np.uint16, (rows, nq * hd))
    for groups in (1, nq // nkv):  # a kv head's query heads in one block, or one a block (the gemv program's)
        part_o, part_ml = gpu.empty(rows * nq * n_splits * hd * 4), gpu.empty(rows * nq * n_splits * 8)
        sem, dec = gpu.put(np.zeros(rows * nq, np.int32)), gpu.empty(rows * nq * hd * 2)
        gpu.run("attention_decode", (rows, nkv * groups, n_splits), 128, dq, dstate, gpu.put(page_table[seq]),
                gpu.put(pos), part_o, part_ml, sem, dec, rows, pps, layer, n_layers, nq, nkv, hd, pt, split_tokens,
                width)
        want = gpu.get(dec, np.uint16, (rows, nq * hd))
        differ = np.flatnonzero((got != want).any(axis=1))
        assert not len(differ), f"head groups {groups}: {len(differ)} of {rows} rows differ, first at sequence " \
                                f"{seq[differ[0]]} position {pos[differ[0]]}"
