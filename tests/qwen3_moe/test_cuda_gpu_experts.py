"""The kernels behind the Qwen3-MoE family's batch invariance on sm_90a (moe_wg.cu), on the GPU,
bit for bit: a (row, choice)'s expert output (SwiGLU of gate/up, then down, f32) is the same
bytes from narrow decode's gather gemvs (mma.sync) and from the wide decode's and prefill's wgmma
tiles over moe_sort's groups, at any number of rows, beside any rows sharing its experts, and
alone; the router's logits from moe_router_gemm are gemv_logits' bytes. Shapes: the `small` test
model's and Qwen3-30B-A3B's (K = 768: a partial last unit; K = 2048: one unit a partial).

    python -m pytest -q tests/qwen3_moe/test_cuda_gpu_experts.py   (on the H200; seconds)"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

BF16 = np.uint16


@pytest.fixture(scope="module")
def gpu(tmp_path_factory):
    from tests.cuda.cuda_gpu import Gpu
    from kern_models.llama.kernels.cuda import CUBINS as DENSE
    from kern_models.qwen3_moe.kernels.cuda import CUBINS

    out = tmp_path_factory.mktemp("moe_cubins")
    DENSE.provide(out, ["gemv.cubin"])
    g = Gpu.of_family(CUBINS, out)
    yield g
    g.close()


def _bf16(rng, shape, scale) -> np.ndarray:
    f = (rng.standard_normal(shape) * scale).astype(np.float32)
    return (f.view(np.uint32) + 0x7FFF + ((f.view(np.uint32) >> 16) & 1) >> 16).astype(BF16)


def _run(gpu, table_ops: dict, op: str, named: dict) -> None:
    from tests.cuda.cuda_gpu import op_launches
    from kern.runtime.devices.cuda.launch import launch

    for la in op_launches(gpu, table_ops[op], dict(named)):
        launch(la, gpu.stream)
    gpu.stream.synchronize()


class Experts:
    """One layer's experts and a routing of `rows` rows (top_k distinct experts a row)."""

    def __init__(self, gpu, hidden: int, inter: int, experts: int, top_k: int, rows: int, seed: int):
        from kern_models.llama.kernels.cuda import table as dense
        from kern_models.qwen3_moe.kernels.cuda import table

        self.gpu, self.ops = gpu, {**table.ops(), **dense.ops()}
        self.hidden, self.inter, self.experts, self.top_k, self.rows = hidden, inter, experts, top_k, rows
        rng = np.random.default_rng(seed)
        self.x = _bf16(rng, (rows, hidden), 1.0)
        self.ids = np.stack([rng.choice(experts, top_k, replace=False) for _ in range(rows)]).astype(np.int32)
        self.W_gu = gpu.put(_bf16(rng, (experts * 2 * inter, hidden), 0.05))
        self.W_d = gpu.put(_bf16(rng, (experts * hidden, inter), 0.05))
        self.W_r = gpu.put(_bf16(rng, (experts, hidden), 0.05))

    def narrow(self, sel) -> tuple[np.ndarray, np.ndarray]:
        """act [pairs, inter] and y [pairs, hidden] of rows `sel` through the gather gemvs."""
        g, n, k = self.gpu, len(sel), self.top_k
        x, ids = g.put(self.x[sel]), g.put(self.ids[sel])
        act, y = g.empty(n * k * self.inter * 2), g.empty(n * k * self.hidden * 4)
        common = dict(ids=ids, rows=n, top_k=k, inter=self.inter, hidden=self.hidden, first=0, count=self.experts)
        _run(g, self.ops, "moe_gather_gate_up", dict(common, x=x, W=self.W_gu, act=act))
        _run(g, self.ops, "moe_gather_down", dict(common, act=act, W=self.W_d, y=y))
        return g.get(act, BF16, (n * k, self.inter)), g.get(y, np.uint32, (n * k, self.hidden))

    def grouped(self, sel) -> tuple[np.ndarray, np.ndarray]:
        """The same through moe_sort and the wgmma tiles (act back in pair order)."""
        from kern_models.qwen3_moe.kernels.cuda.table import TILES

        g, n, k = self.gpu, len(sel), self.top_k
        pairs, tiles = n * k, -(-(n * k) // TILES["MOE_BM"]) + self.experts
        x, ids = g.put(self.x[sel]), g.put(self.ids[sel])
        sorted_, pos, tile_buf = g.empty(pairs * 4), g.empty(pairs * 4), g.empty((1 + 3 * tiles) * 4)
        act, y = g.empty(pairs * self.inter * 2), g.empty(pairs * self.hidden * 4)
        _run(g, self.ops, "moe_sort", dict(ids=ids, sorted=sorted_, pos=pos, tiles=tile_buf, n_pairs=pairs,
                                           experts=self.experts))
        common = dict(sorted=sorted_, tiles=tile_buf, inter=self.inter, hidden=self.hidden, first=0,
                      count=self.experts, max_tiles=tiles)
        _run(g, self.ops, "moe_wg_gate_up", dict(common, x=x, W=self.W_gu, act=act, top_k=k))
        _run(g, self.ops, "moe_wg_down", dict(common, act=act, W=self.W_d, y=y))
        at = g.get(pos, np.int32, pairs)
        return g.get(act, BF16, (pairs, self.inter))[at], g.get(y, np.uint32, (pairs, self.hidden))

    def router(self, op: str, sel) -> np.ndarray:
        g, n = self.gpu, len(sel)
        y = g.empty(n * self.experts * 4)
        _run(g, self.ops, op, dict(x=g.put(self.x[sel]), W=self.W_r, y=y, rows=n, N=self.experts, K=self.hidden))
        return g.get(y, np.uint32, (n, self.experts))


SHAPES = [(256, 64, 16, 4), (2048, 768, 128, 8)]  # hidden, inter, experts, top_k


@pytest.mark.parametrize("hidden,inter,experts,top_k", SHAPES)
@pytest.mark.parametrize("rows", [1, 5, 32, 130])
def test_every_pair_gets_the_same_expert_bytes_by_gather_by_tile_and_alone(gpu, hidden, inter, experts, top_k,
                                                                           rows):
    e = Experts(gpu, hidden, inter, experts, top_k, rows, seed=rows + hidden)
    every = list(range(rows))
    act_g, y_g = e.grouped(every)
    assert not (y_g == 0xFFFFFFFF).all(axis=1).any(), "every pair's output was written"
    few = every[:32]  # narrow decode's rows (its pairs fit the gather's shared list)
    act_n, y_n = e.narrow(few)
    k = top_k
    assert np.array_equal(act_n, act_g[:len(few) * k]) and np.array_equal(y_n, y_g[:len(few) * k]), \
        f"gather != wgmma tiles at {rows} rows"
    for r in sorted({0, rows // 2, rows - 1}):  # a row alone, through either path
        for act1, y1 in (e.narrow([r]), e.grouped([r])):
            assert np.array_equal(y1, y_g[r * k:(r + 1) * k]) and np.array_equal(act1, act_g[r * k:(r + 1) * k]), \
                f"row {r} alone != row {r} of {rows}"


@pytest.mark.parametrize("hidden,inter,experts,top_k", SHAPES)
@pytest.mark.parametrize("rows", [1, 7, 64, 300])
def test_the_router_gemms_give_each_row_the_gemv_bytes(gpu, hidden, inter, experts, top_k, rows):
    e = Experts(gpu, hidden, inter, experts, top_k, rows, seed=rows)
    every = list(range(rows))
    assert np.array_equal(e.router("moe_router_gemm", every), e.router("gemv_logits", every))
    assert np.array_equal(e.router("moe_router_gemm_split", every), e.router("gemv_logits", every))  # the wide decode's
    assert np.array_equal(e.router("moe_router_gemm", [rows - 1])[0], e.router("moe_router_gemm", every)[-1])



def _sorted_reference(ids: np.ndarray, experts: int, bm: int) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """moe_sort's contract in numpy: each expert's pairs in pair order, tiles of <= bm positions."""
    flat = ids.ravel()
    order = np.argsort(flat, kind="stable").astype(np.int32)
    pos = np.empty_like(order)
    pos[order] = np.arange(len(order), dtype=np.int32)
    tiles, at = [], 0
    for e in range(experts):
        c = int((flat == e).sum())
        tiles += [v for s in range(at, at + c, bm) for v in (e, s, min(s + bm, at + c))]
        at += c
    return order, pos, [len(tiles) // 3, *tiles]


@pytest.mark.parametrize("experts,top_k", [(16, 4), (128, 8), (256, 8)])
@pytest.mark.parametrize("rows", [1, 3, 16, 64, 256])
def test_the_fused_routing_is_moe_route_then_moe_sort_byte_for_byte(gpu, experts, top_k, rows):
    """moe_route_sort (the decode programs' one launch) gives moe_route's ids and weights and
    moe_sort's sorted, pos and tiles, and those are the stable counting sort's; the logits carry
    ties (equal values in a row), which go to the lower expert in both."""
    from kern_models.qwen3_moe.kernels.cuda import table

    ops = table.ops()
    rng = np.random.default_rng(rows * experts)
    logits = rng.standard_normal((rows, experts)).astype(np.float32)
    logits[:, 1::4] = logits[:, ::4][:, :logits[:, 1::4].shape[1]]  # ties
    pairs, bm = rows * top_k, table.TILES["MOE_BM"]
    n_tiles = -(-pairs // bm) + experts
    outs = {}
    for fused in (False, True):
        g = gpu
        lg = g.put(logits)
        ids, w = g.empty(pairs * 4), g.empty(pairs * 4)
        sorted_, pos, tiles = g.empty(pairs * 4), g.empty(pairs * 4), g.empty((1 + 3 * n_tiles) * 4)
        if fused:
            _run(g, ops, "moe_route_sort", dict(logits=lg, ids=ids, weights=w, sorted=sorted_, pos=pos, tiles=tiles,
                                                rows=rows, experts=experts, top_k=top_k, norm_topk=1))
        else:
            _run(g, ops, "moe_route", dict(logits=lg, ids=ids, weights=w, rows=rows, experts=experts, top_k=top_k,
                                           norm_topk=1))
            _run(g, ops, "moe_sort", dict(ids=ids, sorted=sorted_, pos=pos, tiles=tiles, n_pairs=pairs, experts=experts))
        got = [g.get(ids, np.int32, (rows, top_k)), g.get(w, np.uint32, pairs), g.get(sorted_, np.int32, pairs),
               g.get(pos, np.int32, pairs)]
        t = g.get(tiles, np.int32, 1 + 3 * n_tiles)
        outs[fused] = got + [list(t[:1 + 3 * int(t[0])])]
    for a, b in zip(outs[False], outs[True]):
        assert np.array_equal(np.asarray(a), np.asarray(b))
    ids = outs[True][0]
    assert all(len(set(r)) == top_k for r in ids.tolist()), "top_k distinct experts a row"
    order, pos, tiles = _sorted_reference(ids, experts, bm)
    assert np.array_equal(outs[True][2], order) and np.array_equal(outs[True][3], pos) and outs[True][4] == tiles
