"""Time the llama kernels on the GPU (not a test; run by hand on the device):

    PYTHONPATH=src python3 -m tests.cuda.bench_cuda_kernels [bench_gemv bench_attention ...]
    PYTHONPATH=src ncu -k attention_decode --set full python3 -m tests.cuda.bench_cuda_kernels ncu_attention

(from the repository root: the module imports its siblings as tests.cuda.*)

Earlier versions of kernel sources copied into tests/cuda/_variants/<label>/ (with the headers
they include) are built and timed beside the working tree's kernels ("new").
gemv is also timed with the PDL launch attribute ("new+pdl").

Each case is captured in a CUDA graph of REPS launches cycling through enough copies of its
inputs to defeat the 60 MB L2, replayed after a warm-up, timed with CUDA events (median of 5).
Prints one line per case: microseconds per launch and the bytes-moved rate."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

from kern.runtime.devices.cuda import memory
from kern.runtime.devices.cuda.driver import call, open_device
from kern.runtime.devices.cuda.graphs import capture
from kern.runtime.devices.cuda.launch import launch
from tests.cuda import cuda_refs as R
from tests.cuda.cuda_gpu import Gpu, launch_all

REPS = 20
L2_DEFEAT = 240 << 20


def copies(nbytes: int) -> int:
    return max(1, min(REPS, -(-L2_DEFEAT // max(nbytes, 1))))


def time_graph(gpu: Gpu, launches) -> float:
    """Median microseconds per launch group (len(launches) / REPS launches per group)."""
    return gpu.graph_ms(launches, REPS) * 1000


def row(name: str, us: float, nbytes: float) -> str:
    return f"{name:<44} {us:9.2f} us  {nbytes / us / 1e3:8.1f} GB/s"


GEMV_SHAPES = [  # (model, name, N, K, entry)
    ("llama-1b", "qkv", 3072, 2048, "gemv_bf16"), ("llama-1b", "o_proj", 2048, 2048, "gemv_bf16"),
    ("llama-1b", "gate_up", 16384, 2048, "gemv_bf16"), ("llama-1b", "down", 2048, 8192, "gemv_bf16"),
    ("llama-1b", "lm_head", 128256, 2048, "gemv_f32"),
    ("smollm2-135m", "qkv", 960, 576, "gemv_bf16"), ("smollm2-135m", "o_proj", 576, 576, "gemv_bf16"),
    ("smollm2-135m", "gate_up", 3072, 576, "gemv_bf16"), ("smollm2-135m", "down", 576, 1536, "gemv_bf16"),
    ("smollm2-135m", "lm_head", 49152, 576, "gemv_f32"),
]
# grid columns per block of each version of gemv (the old kernel: one warp per column)
GEMV_COLS = {"old": 8}  # others: 16


def rand_weights(rng, shape, scale=0.05) -> np.ndarray:
    """Random bf16 without drawing every element (a random 4M block tiled): not zeros, fast."""
    n = int(np.prod(shape))
    base = R.rand_bf16(rng, (min(n, 1 << 22),), scale)
    return np.resize(base, n).reshape(shape)


def bench_gemv(gpus: dict, rng, lines: list[str], row_counts=(1, 16, 32)) -> None:
    for model, name, N, K, entry in GEMV_SHAPES:
        wbytes = N * K * 2
        ws = [gpus["new"].put(rand_weights(rng, (N, K))) for _ in range(copies(wbytes))]
        for rows in row_counts:
            if model != "llama-1b" and rows == 32:
                continue
            x = gpus["new"].put(R.rand_bf16(rng, (rows, K)))
            y = gpus["new"].empty(rows * N * 4)
            res = []
            for label, gpu in gpus.items():
                cols = GEMV_COLS.get(label, 16)
                ls = [gpu.make(entry, -(-N // cols), 256, x, ws[i % len(ws)], y, rows, N, K) for i in range(REPS)]
                us = time_graph(gpu, ls)
                res.append(f"{label} {us:8.2f} us {wbytes / us / 1e6:5.2f} TB/s")
                if label == "new":
                    try:  # the same launches with the PDL attribute: weight loads overlap the previous launch
                        ls = [gpu.make(entry, -(-N // cols), 256, x, ws[i % len(ws)], y, rows, N, K, pdl=True)
                              for i in range(REPS)]
                        us = time_graph(gpu, ls)
                        res.append(f"new+pdl {us:8.2f} us {wbytes / us / 1e6:5.2f} TB/s")
                    except Exception as e:  # noqa: BLE001
                        res.append(f"pdl failed: {e}")
            lines.append(f"gemv {model:<12} {name:<8} {N:>6}x{K:<5} rows={rows:<2} " + " | ".join(res))
            print(lines[-1], flush=True)
        for w in ws:
            w.free()
        gpus["new"]._bufs = [b for b in gpus["new"]._bufs if not b.freed]


def bench_attention(gpus: dict, rng, lines: list[str]) -> None:
    """Decode attention as the manifest launches it (the split merge inside): split 64, n_splits
    64 (context 4096), every row at position ctx - 1, one layer of state."""
    pt, n_layers, split, n_splits = 16, 1, 64, 64
    for model, nq, nkv, hd in [("llama-1b", 32, 8, 64), ("smollm2-135m", 9, 3, 64)]:
        for rows, ctx in [(1, 16), (1, 160), (1, 1024), (1, 4096), (16, 16), (16, 160), (16, 1024)]:
            pps = 4096 // pt
            n_pages = rows * (-(-ctx // pt))
            state_bytes = n_pages * pt * n_layers * 2 * nkv * hd * 2
            n_copies = copies(state_bytes)
            states = [gpus["new"].put(rand_weights(rng, (n_pages, n_layers, 2, nkv, pt, hd), 1.0))
                      for _ in range(n_copies)]
            table = np.zeros((rows, pps), np.int32)
            table[:, : -(-ctx // pt)] = rng.permutation(n_pages).reshape(rows, -1)
            table = gpus["new"].put(table)
            pos = gpus["new"].put(np.full(rows, ctx - 1, np.int32))
            q = gpus["new"].put(R.rand_bf16(rng, (rows, nq * hd)))
            po = gpus["new"].empty(rows * nq * n_splits * hd * 4)
            pm = gpus["new"].empty(rows * nq * n_splits * 8)
            o = gpus["new"].empty(rows * nq * hd * 2)
            sem = gpus["new"].put(np.zeros(rows * nkv, np.int32))
            res, outs = [], {}
            for label, gpu in gpus.items():
                ls = []
                for i in range(REPS):
                    ls.append(gpu.make("attention_decode", (rows, nkv, n_splits), 128, q, states[i % n_copies], table,
                                       pos, po, pm, sem, o, rows, pps, 0, n_layers, nq, nkv, hd, pt, split, nq * hd))
                us = time_graph(gpu, ls)
                outs[label] = R.f32(gpu.get(o, R.BF16, (rows, nq * hd)))
                res.append(f"{label} {us:8.2f} us")
            diff = float(np.abs(outs["new"] - outs["old"]).max()) if "old" in outs else 0.0
            lines.append(f"attn {model:<12} rows={rows:<2} ctx={ctx:<5} " + " | ".join(res) + f" | max|new-old| {diff:.3g}")
            print(lines[-1], flush=True)
            for st in states:
                st.free()
            gpus["new"]._bufs = [b for b in gpus["new"]._bufs if not b.freed]


GROUP_SHAPES = [("qwen3-30b-a3b", 32, 4, 128), ("llama-1b", 32, 8, 64)]  # (model, nq, nkv, head_dim)


def _decode_attention_case(gpu: Gpu, rng, nq: int, nkv: int, hd: int, rows: int, ctx: int, n_copies: int):
    """Decode attention's inputs as the decode program has them at context ctx (every row at
    position ctx - 1, one layer of state, pages shuffled); n_copies of the state (L2)."""
    pt, pps = 16, 1024 // 16
    n_pages = rows * (-(-ctx // pt))
    states = [gpu.put(rand_weights(rng, (n_pages, 1, 2, nkv, pt, hd), 1.0)) for _ in range(n_copies)]
    table = np.zeros((rows, pps), np.int32)
    table[:, : -(-ctx // pt)] = rng.permutation(n_pages).reshape(rows, -1)
    return {"states": states, "table": gpu.put(table), "pos": gpu.put(np.full(rows, ctx - 1, np.int32)),
            "q": gpu.put(R.rand_bf16(rng, (rows, nq * hd))), "pps": pps, "pt": pt}


def _decode_attention_launch(gpu: Gpu, c: dict, i: int, nq: int, nkv: int, hd: int, rows: int, groups: int,
                             n_splits: int, bufs):
    po, pm, sem, o = bufs
    return gpu.make("attention_decode", (rows, nkv * groups, n_splits), 128, c["q"], c["states"][i % len(c["states"])],
                    c["table"], c["pos"], po, pm, sem, o, rows, c["pps"], 0, 1, nq, nkv, hd, c["pt"], 128, nq * hd)


def bench_attention_groups(gpus: dict, rng, lines: list[str]) -> None:
    """Decode attention as the decode program launches it at context 160 (split 128, the reach
    bucket 256: 2 splits), with each head_groups that divides G (query heads a block: G /
    head_groups). Versions in tests/cuda/_variants that predate head_groups run at 1 only."""
    ctx, n_splits = 160, 2
    for model, nq, nkv, hd in GROUP_SHAPES:
        G = nq // nkv
        for rows in (1, 16, 64):
            state_bytes = rows * ctx * 2 * nkv * hd * 2
            c = _decode_attention_case(gpus["new"], rng, nq, nkv, hd, rows, ctx, copies(state_bytes))
            bufs = (gpus["new"].empty(rows * nq * n_splits * hd * 4), gpus["new"].empty(rows * nq * n_splits * 8),
                    gpus["new"].put(np.zeros(rows * nq, np.int32)), gpus["new"].empty(rows * nq * hd * 2))
            res, outs = [], {}
            for label, gpu in gpus.items():
                for groups in [d for d in range(1, G + 1) if G % d == 0] if label != "old" else [1]:
                    ls = [_decode_attention_launch(gpu, c, i, nq, nkv, hd, rows, groups, n_splits, bufs)
                          for i in range(REPS)]
                    us = time_graph(gpu, ls)
                    outs[(label, groups)] = gpu.get(bufs[3], R.BF16, (rows, nq * hd)).view(np.uint16)
                    res.append(f"{label}/{G // groups}h {us:7.2f}")
            same = all(np.array_equal(v, outs[("new", 1)]) for v in outs.values())
            lines.append(f"attn groups {model:<13} rows={rows:<2} ctx={ctx} us (version/heads a block): "
                         + " | ".join(res) + f" | bits all equal: {same}")
            print(lines[-1], flush=True)
            for st in c["states"]:
                st.free()
            gpus["new"]._bufs = [b for b in gpus["new"]._bufs if not b.freed]


def bench_rows(gpus: dict, rng, lines: list[str]) -> None:
    """A prompt's attention, one layer: attention_rows (decode's order, the default build) beside
    prefill_attention (the --no-batch-invariance build's), prompts of 2,040 and 4 x 512 rows,
    split 128; a _variants version's attention_rows takes its old grid (a row and kv head)."""
    pt = 16
    for model, nq, nkv, hd in [("llama-1b", 32, 8, 64), ("llama-8b", 32, 8, 128)]:
        for lens in ([2040], [512] * 4):
            rows, pps = sum(lens), -(-max(lens) // pt)
            n_pages = len(lens) * pps
            state = gpus["new"].put(rand_weights(rng, (n_pages, 1, 2, nkv, pt, hd), 1.0))
            table = gpus["new"].put(rng.permutation(n_pages).reshape(len(lens), pps).astype(np.int32))
            cu = gpus["new"].put(np.concatenate([[0], np.cumsum(lens)]).astype(np.int32))
            pos = gpus["new"].put(np.concatenate([np.arange(n) for n in lens]).astype(np.int32))
            width = (nq + 2 * nkv) * hd
            q, o = gpus["new"].put(R.rand_bf16(rng, (rows, width))), gpus["new"].empty(rows * nq * hd * 2)
            flops = 4 * sum(n * (n + 1) / 2 for n in lens) * nq * hd
            res = []
            for label, gpu in gpus.items():
                grid = (nq, -(-rows // 64) + len(lens)) if label == "new" else (rows, nkv)
                ls = [gpu.make("attention_rows", grid, 128, q, state, table, cu, pos, o, rows, len(lens), pps, 0, 1,
                               nq, nkv, hd, pt, 128, width) for _ in range(REPS)]
                us = time_graph(gpu, ls)
                res.append(f"{label} rows {us:8.1f} us ({flops / us / 1e6:.0f} TFLOP/s)")
            ls = [gpus["new"].make("prefill_attention", (nq, -(-rows // 64) + len(lens)), 128, q, state, table, cu, pos,
                                   o, rows, len(lens), pps, 0, 1, nq, nkv, hd, pt, width) for _ in range(REPS)]
            us = time_graph(gpus["new"], ls)
            res.append(f"prefill_attention {us:8.1f} us")
            lines.append(f"rows {model:<9} {'+'.join(map(str, lens)):<15} " + " | ".join(res))
            print(lines[-1], flush=True)


def ncu_attention(gpus: dict, rng, lines: list[str]) -> None:
    """One launch of each version and head grouping at Qwen3-30B-A3B's shape, 1 row, context
    160, no graph: the target of `ncu -k attention_decode`."""
    model, nq, nkv, hd = GROUP_SHAPES[0]
    c = _decode_attention_case(gpus["new"], rng, nq, nkv, hd, 1, 160, 1)
    bufs = (gpus["new"].empty(nq * 2 * hd * 4), gpus["new"].empty(nq * 2 * 8), gpus["new"].put(np.zeros(nq, np.int32)),
            gpus["new"].empty(nq * hd * 2))
    for label, gpu in gpus.items():
        for groups in (1, 2, 8) if label != "old" else (1,):
            launch(_decode_attention_launch(gpu, c, 0, nq, nkv, hd, 1, groups, 2, bufs), gpu.stream)
            gpu.stream.synchronize()
            lines.append(f"ncu target launched: {label}, {nq // nkv // groups} heads a block")


def bench_fused(gpus: dict, rng, lines: list[str]) -> None:
    """The decode fusions beside the plain gemv of the same shape (Llama-3.2-1B), without and
    with the PDL attribute; the old gemv when tests/cuda/_variants/old exists."""
    hidden, inter, eps = 2048, 8192, 1e-5
    gpu = gpus["new"]
    for name, N, K, fused in [("qkv", 3072, 2048, "norm_gemv_bf16"), ("o_proj", 2048, 2048, "gemv_residual"),
                              ("gate_up", 16384, 2048, "norm_gemv_swiglu"), ("down", 2048, 8192, "gemv_residual")]:
        ws = [gpu.put(rand_weights(rng, (N, K))) for _ in range(copies(N * K * 2))]
        for rows in (1, 16):
            x = gpu.put(R.rand_bf16(rng, (rows, 2 * K)))
            nw = gpu.put(R.rand_bf16(rng, (K,)))
            y = gpu.empty(rows * N * 4)
            res = gpu.put(R.rand_bf16(rng, (rows, N)))
            out = []
            for label, g in gpus.items():
                for pdl in (False, True):
                    ls = [g.make("gemv_bf16", -(-N // 16), 256, x, ws[i % len(ws)], y, rows, N, K, pdl=pdl)
                          for i in range(REPS)]
                    out.append(f"{label} gemv{'+pdl' if pdl else ''} {time_graph(g, ls):7.2f}")
            first = None
            for label, g in gpus.items():
                if "gemv" not in g.modules:
                    continue
                grid = -(-N // 16)
                for pdl in (False, True):
                    if fused == "norm_gemv_swiglu":  # N outputs of gate_up are N/2 act columns, 8 a block
                        mk = lambda i: g.make(fused, grid, 256, x, nw, ws[i % len(ws)], y, rows, N // 2, K,
                                              eps, pdl=pdl)
                    elif fused.startswith("norm"):
                        mk = lambda i: g.make(fused, grid, 256, x, nw, ws[i % len(ws)], y, rows, N, K, eps,
                                              pdl=pdl)
                    else:
                        mk = lambda i: g.make(fused, grid, 256, x, ws[i % len(ws)], res, rows, N, K, pdl=pdl)
                    try:
                        us = time_graph(g, [mk(i) for i in range(REPS)])
                    except Exception as e:  # noqa: BLE001 - an older variant may lack the entry
                        out.append(f"{label} {fused}: {type(e).__name__}")
                        break
                    out.append(f"{label} {fused}{'+pdl' if pdl else ''} {us:7.2f}")
                if not fused.endswith("residual"):  # y is overwritten, not accumulated: compare
                    got = g.get(y, np.uint16, (rows * (N // 2 if fused == "norm_gemv_swiglu" else N),))
                    first = got if first is None else first
                    out.append("same as first" if np.array_equal(got, first) else "DIFFERS from first")
            lines.append(f"fused {name:<8} {N:>6}x{K:<5} rows={rows:<2} us: " + " | ".join(out))
            print(lines[-1], flush=True)
        for w in ws:
            w.free()
        gpu._bufs = [b for b in gpu._bufs if not b.freed]


def bench_small(gpu: Gpu, rng, lines: list[str]) -> None:
    hidden, inter, vocab = 2048, 8192, 128256
    x, w, y = gpu.put(R.rand_bf16(rng, (1, hidden))), gpu.put(R.rand_bf16(rng, (hidden,))), gpu.empty(hidden * 2)
    ls = [gpu.make("rms_norm", 1, 256, x, w, y, 1, hidden, 1e-5) for _ in range(REPS)]
    lines.append(row("rms_norm 1x2048", time_graph(gpu, ls), hidden * 6))
    gu, h = gpu.put(R.rand_bf16(rng, (1, 2 * inter))), gpu.empty(inter * 2)
    ls = [gpu.make("silu_mul", (1, inter // 2048), 256, gu, h, 1, inter) for _ in range(REPS)]
    lines.append(row("silu_mul 1x8192", time_graph(gpu, ls), inter * 6))
    logits = gpu.put(rng.standard_normal((1, vocab)).astype(np.float32))
    pv, pi, tok = gpu.empty(128 * 4), gpu.empty(128 * 4), gpu.empty(4)
    temp, key = gpu.put(np.zeros(1, np.float32)), gpu.put(np.zeros((1, 2), np.int32))
    words = -(-vocab // 32)
    allow = gpu.put(np.where(rng.random((1, words)) < 0.5, -1, 0x5555).astype(np.int32))  # a grammar-like mask
    for name, row_of in (("", 0), (" masked", 1)):
        mask_row = gpu.put(np.full(1, row_of, np.int32))
        ls = []
        for _ in range(REPS):
            ls.append(gpu.make("sample_partial", (128, 1), 256, logits, temp, key, allow, mask_row, pv, pi, vocab, 1,
                               128))
            ls.append(gpu.make("argmax_final", 1, 32, pv, pi, tok, 1, 128))
        lines.append(row(f"sample (greedy{name}) partial+final 1x128256", time_graph(gpu, ls), vocab * 4))


def bench_launch_overheads(gpu: Gpu, lines: list[str]) -> None:
    x, w, y = gpu.put(np.zeros((1, 512), R.BF16)), gpu.put(np.zeros(512, R.BF16)), gpu.empty(1024)
    l = gpu.make("rms_norm", 1, 256, x, w, y, 1, 512, 1e-5)
    for _ in range(50):
        launch(l, gpu.stream)
    gpu.stream.synchronize()
    t0 = time.perf_counter()
    for _ in range(2000):
        launch(l, gpu.stream)
    t1 = time.perf_counter()
    gpu.stream.synchronize()
    lines.append(f"{'eager launch, host time per launch':<44} {(t1 - t0) / 2000 * 1e6:9.2f} us")
    g = capture(gpu.stream, lambda: launch_all([l] * 300, gpu.stream), "tiny")
    g.replay(gpu.stream)
    gpu.stream.synchronize()
    t0 = time.perf_counter()
    for _ in range(200):
        g.replay(gpu.stream)
    t1 = time.perf_counter()
    gpu.stream.synchronize()
    t2 = time.perf_counter()
    lines.append(f"{'graph of 300 tiny launches: host per replay':<44} {(t1 - t0) / 200 * 1e6:9.2f} us")
    lines.append(f"{'graph of 300 tiny launches: device per launch':<44} {(t2 - t0) / 200 / 300 * 1e6:9.2f} us")


def cublaslt_us(lt, gpu: Gpu, x, W, y, M: int, N: int, K: int) -> float:
    """Microseconds a cuBLASLt bf16 TN GEMM (y = x W^T), the mean of 20 after 3 warm-ups."""
    for _ in range(3):
        lt.gemm_bf16_tn(x.ptr, W.ptr, y.ptr, M, N, K, gpu.stream)
    start, stop = call("cuEventCreate", 0), call("cuEventCreate", 0)
    call("cuEventRecord", start, gpu.stream.handle)
    for _ in range(20):
        lt.gemm_bf16_tn(x.ptr, W.ptr, y.ptr, M, N, K, gpu.stream)
    call("cuEventRecord", stop, gpu.stream.handle)
    call("cuEventSynchronize", stop)
    return call("cuEventElapsedTime", start, stop) * 1000 / 20


def bench_cublaslt(gpu: Gpu, rng, lines: list[str]) -> None:
    from kern.runtime.devices.cuda.cublaslt import CublasLt
    lt = CublasLt()
    for M, N, K in [(512, 2048, 8192), (2048, 16384, 2048), (4096, 4096, 4096)]:
        x, W, y = gpu.put(R.rand_bf16(rng, (M, K))), gpu.put(R.rand_bf16(rng, (N, K), 0.05)), gpu.empty(M * N * 2)
        us = cublaslt_us(lt, gpu, x, W, y, M, N, K)
        lines.append(f"{f'cublaslt bf16 TN {M}x{N}x{K}':<44} {us:9.2f} us  {2 * M * N * K / us / 1e6:8.1f} TFLOP/s")


GEMM_LAYERS = {  # a layer's projections: (N, K, normed); normed ones are rms_prep + the GEMM
    "llama-3.2-1b": [(3072, 2048, True), (2048, 2048, False), (16384, 2048, True), (2048, 8192, False)],
    "llama-3.1-8b": [(6144, 4096, True), (4096, 4096, False), (28672, 4096, True), (4096, 14336, False)],
}


def bench_gemm(gpu: Gpu, rng, lines: list[str], row_counts=(8, 32, 128, 512, 2048)) -> None:
    """The batch-invariant projections of a layer as the programs run them (table.ops(): the
    normed qkv and gate/up with rms_prep, the residual o and down; the split variant up to the
    wide decode's 256 rows; the gemv at the decode program's 8 rows) beside cuBLASLt's bf16 TN
    GEMM at the same (M, N, K) (the --no-batch-invariance build's call): a line a projection,
    then the layer's four summed, kern's best over cuBLASLt's."""
    from tests.cuda.cuda_gpu import op_launches
    from kern.runtime.devices.cuda.cublaslt import CublasLt
    from kern_models.llama.kernels.cuda import table
    lt = CublasLt()
    ops = table.ops()
    eps = 1e-5
    for model, layer in GEMM_LAYERS.items():
        for M in row_counts:
            sums = {"gemv": 0.0, "split": 0.0, "big": 0.0, "cublaslt": 0.0}
            for N, K, normed in layer:
                n_copies = copies(N * K * 2)
                Ws = [gpu.put(rand_weights(rng, (N, K))) for _ in range(n_copies)]
                x, nw, y = gpu.put(R.rand_bf16(rng, (M, K))), gpu.put(R.rand_bf16(rng, (K,))), gpu.empty(M * N * 4)
                kinds = {"big": "norm_gemm" if normed else "gemm_residual"}
                if M <= 256:
                    kinds["split"] = kinds["big"] + "_split"
                if M <= 32:
                    kinds["gemv"] = "norm_gemv" if normed else "gemv_residual"
                for kind, op in kinds.items():
                    named = dict(W=Ws[0], rows=M, N=N, K=K)
                    named.update(dict(res=x, nw=nw, y=y, eps=eps) if normed else dict(x=x, res=y))
                    launches = []
                    for i in range(REPS):
                        named["W"] = Ws[i % n_copies]
                        launches += op_launches(gpu, ops[op], named)
                    us = time_graph(gpu, launches)
                    lines.append(row(f"{model} {op} {M}x{N}x{K}", us, N * K * 2)
                                 + f" {2 * M * N * K / us / 1e6:7.1f} TFLOP/s")
                    sums[kind] += us
                us_lt = cublaslt_us(lt, gpu, x, Ws[0], y, M, N, K)
                lines.append(row(f"{model} cublaslt {M}x{N}x{K}", us_lt, N * K * 2)
                             + f" {2 * M * N * K / us_lt / 1e6:7.1f} TFLOP/s")
                sums["cublaslt"] += us_lt
            lib = sums["cublaslt"]
            best = min(v for k, v in sums.items() if v and k != "cublaslt")
            lines.append(f"{f'{model} layer projections at {M} rows':<44} " + "  ".join(
                f"{k} {v:8.1f} us ({v / lib:5.2f})" for k, v in sums.items() if v) + f"  best/cublaslt {best / lib:5.2f}")
            print(lines[-1], flush=True)


def main() -> None:
    import subprocess
    import sys
    from tests.cuda.cuda_kernel_docs import TEST_KERNEL_DIR
    from kern_models.llama.kernels.cuda import CUBINS

    out = Path(tempfile.mkdtemp())
    CUBINS.provide(out)  # the pinned cubins where their sources are unchanged, else nvcc
    CUBINS.build(out, srcs=CUBINS.sources(TEST_KERNEL_DIR))
    dev = open_device(0)
    gpus = {"new": Gpu(dev, out)}
    # optional: earlier versions of some .cu files in _variants/<label>/ (with the headers they
    # include), timed beside the working tree's kernels ("new")
    var_root = Path(__file__).resolve().parent / "_variants"
    if var_root.is_dir():
        new = gpus.pop("new")
        for vdir in sorted(p for p in var_root.iterdir() if p.is_dir()):
            vout = Path(tempfile.mkdtemp())
            for src in sorted(vdir.glob("*.cu")):
                subprocess.run(["nvcc", *CUBINS.flags(), "-I", ".", src.name, "-o", str(vout / f"{src.stem}.cubin")],
                               cwd=vdir, check=True)
            for p in out.glob("*.cubin"):
                if not (vout / p.name).exists():
                    (vout / p.name).write_bytes(p.read_bytes())
            gpus[vdir.name] = Gpu(dev, vout)
        gpus["new"] = new
    gpu = gpus["new"]
    rng = np.random.default_rng(0)
    only = sys.argv[1:]
    lines: list[str] = [f"device: {gpu.device.name}, {gpu.device.multiprocessors} SMs"]
    for f in (bench_gemv, bench_fused, bench_attention, bench_attention_groups, bench_rows, bench_launch_overheads,
              bench_small, bench_cublaslt, bench_gemm, ncu_attention):
        if only and f.__name__ not in only or not only and f is ncu_attention:
            continue
        try:
            if f is bench_launch_overheads:
                f(gpu, lines)
            elif f in (bench_gemv, bench_fused, bench_attention, bench_attention_groups, bench_rows, ncu_attention):
                f(gpus, rng, lines)
            else:
                f(gpu, rng, lines)
        except Exception as e:  # noqa: BLE001 - report and go on to the next case
            import traceback
            traceback.print_exc()
            lines.append(f"{f.__name__} failed: {e}")
        print(lines[-1], flush=True)
    print("\n".join(lines))
    for g in gpus.values():
        g.close()


if __name__ == "__main__":
    main()
