"""The kernels behind sm_90a's batch invariance (docs/determinism.md), on the GPU, bit for bit:
each gemm twin (gemm.cu: prefill's projections; its split variant: the wide decode's) gives
every row the bytes its gemv kernel (the decode program's) gives it, at any number of rows; attention_rows
(prefill) gives a prompt row the bytes attention_decode gives the same token decoded."""

import numpy as np
import pytest

import cuda_refs as R
from kern_models.llama.kernels.cuda.table import TILES
from test_cuda_gpu_kernels import _paged_state, _table

pytestmark = pytest.mark.gpu

EPS = 1e-5
# (rows, N, K): K of less than a unit (256), a partial last unit (576 = 2.25 units), one unit a
# partial (2048), four (8192); rows past one 64-row block (the split's) and one 128-row block
# (prefill's), N past one tile of either
SHAPES = [(1, 64, 200), (5, 960, 576), (70, 1536, 576), (37, 2048, 2048), (130, 200, 8192), (259, 1040, 1024)]


BIG_SMEM, SPLIT_SMEM = TILES["GEMM_BIG_SMEM"], TILES["GEMM_SMEM"]


def _big(n_tiles: int, rows: int) -> tuple:
    """Prefill's gemm entries: grid and block (GEMM_BIG_TILES gemv tiles and GEMM_BIG_ROWS rows a block)."""
    return (-(-n_tiles // TILES["GEMM_BIG_TILES"]), -(-rows // TILES["GEMM_BIG_ROWS"])), 256


def _both(gpu, gemv: str, gemm: str, rows: int, n_tiles: int, out_of) -> None:
    """Runs the gemv kernel over `rows` rows, the gemm twin and its split variant over them,
    then the gemm twin over single rows: the same bytes everywhere. out_of(run, n, r0, scratch)
    runs a kernel over rows r0 .. r0 + n (at the start of fresh buffers; scratch: the split
    variant's part and sem, after the pointers) and returns its outputs, the rows' first."""
    ref = out_of(lambda *a: gpu.run(gemv, n_tiles, 256, *a), rows, 0, ())
    got = out_of(lambda *a: gpu.run(gemm, *_big(n_tiles, rows), *a, shared_mem=BIG_SMEM), rows, 0, ())
    grid = (-(-n_tiles // 4), -(-rows // 64))
    sem = gpu.put(np.zeros(grid[0] * grid[1], np.int32))
    split = out_of(lambda *a: gpu.run(gemm + "_split", (*grid, 8), 128, *a, shared_mem=SPLIT_SMEM), rows, 0,
                   (gpu.empty(grid[0] * grid[1] * 8 * TILES["GEMM_PART"] * 4), sem))
    for a, b, c in zip(ref, got, split):
        assert np.array_equal(a, b), f"{gemm} at {rows} rows != {gemv}"
        assert np.array_equal(a, c), f"{gemm}_split at {rows} rows != {gemv}"
    assert not gpu.get(sem, np.int32, grid[0] * grid[1]).any(), "the split counters are back at zero"
    for r in sorted({0, rows // 2, rows - 1}):
        alone = out_of(lambda *a: gpu.run(gemm, *_big(n_tiles, 1), *a, shared_mem=BIG_SMEM), 1, r, ())
        assert np.array_equal(alone[0][0], got[0][r]), f"{gemm}: row {r} alone != row {r} of {rows}"


@pytest.mark.parametrize("rows,N,K", SHAPES)
def test_norm_gemm_and_gemm_residual_give_each_row_the_gemv_bytes(gpu, rows, N, K):
    rng = np.random.default_rng(rows + N + K)
    res, nw, W = R.rand_bf16(rng, (rows, K), 3.0), R.rand_bf16(rng, (K,)), R.rand_bf16(rng, (N, K), 0.05)
    x, base = R.rand_bf16(rng, (rows, K), 2.0), R.rand_bf16(rng, (rows, N), 4.0)
    dnw, dW = gpu.put(nw), gpu.put(W)
    def out_of(run, n, r0, scratch):
        y = gpu.empty(n * N * 2)
        run(gpu.put(res[r0:r0 + n]), dnw, dW, y, *scratch, n, N, K, EPS)
        return (gpu.get(y, np.uint16, (n, N)),)
    _both(gpu, "norm_gemv_bf16", "norm_gemm_bf16", rows, -(-N // 16), out_of)
    # the f32 LM head has no split variant (its vocabulary gives blocks enough)
    y32 = [gpu.empty(rows * N * 4) for _ in range(2)]
    gpu.run("norm_gemv_f32", -(-N // 16), 256, gpu.put(res), dnw, dW, y32[0], rows, N, K, EPS)
    gpu.run("norm_gemm_f32", *_big(-(-N // 16), rows), gpu.put(res), dnw, dW, y32[1], rows, N, K, EPS,
            shared_mem=BIG_SMEM)
    assert np.array_equal(*(gpu.get(y, np.uint32, (rows, N)) for y in y32)), "norm_gemm_f32 != norm_gemv_f32"

    def residual(run, n, r0, scratch):
        y = gpu.put(base[r0:r0 + n])
        run(gpu.put(x[r0:r0 + n]), dW, y, *scratch, n, N, K)
        return (gpu.get(y, np.uint16, (n, N)),)
    _both(gpu, "gemv_residual", "gemm_residual", rows, -(-N // 16), residual)


@pytest.mark.parametrize("rows,inter,K", [(3, 1536, 576), (100, 104, 2048)])
def test_norm_gemm_swiglu_gives_each_row_the_gemv_bytes(gpu, rows, inter, K):
    rng = np.random.default_rng(14)
    res, nw = R.rand_bf16(rng, (rows, K), 3.0), R.rand_bf16(rng, (K,))
    dnw, dW = gpu.put(nw), gpu.put(R.rand_bf16(rng, (2 * inter, K), 0.05))

    def out_of(run, n, r0, scratch):
        act = gpu.empty(n * inter * 2)
        run(gpu.put(res[r0:r0 + n]), dnw, dW, act, *scratch, n, inter, K, EPS)
        return (gpu.get(act, np.uint16, (n, inter)),)
    _both(gpu, "norm_gemv_swiglu", "norm_gemm_swiglu", rows, -(-inter // 8), out_of)


@pytest.mark.parametrize("hd,nq,nkv,rows", [(64, 9, 3, 1), (64, 9, 3, 77), (128, 8, 2, 20)])
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

    def out_of(run, n, r0, scratch):  # rows r0 .. r0 + n as sequences of one row each
        d, ds = gpu.empty(n * N * 2), gpu.put(state)
        cu = np.arange(n + 1, dtype=np.int32)
        run(gpu.put(res[r0:r0 + n]), dnw, dW, d, ds, gpu.put(page_table[r0:r0 + n]), gpu.put(cu),
            gpu.put(pos[r0:r0 + n]), dtab, *scratch, pps, n, n, layer, n_layers, nq, nkv, hd, pt, N, K, EPS)
        return gpu.get(d, np.uint16, (n, N)), gpu.get(ds, np.uint16, state.shape)
    _both(gpu, "norm_gemv_rope_append", "norm_gemm_rope_append", rows, N // 16, out_of)


@pytest.mark.parametrize("nq,nkv,hd", [(9, 3, 64), (32, 8, 64), (8, 2, 128), (16, 2, 256)])
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
    gpu.run("attention_rows", (rows, nkv), 128, dq, dstate, gpu.put(page_table), gpu.put(cu), gpu.put(pos), pre,
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
