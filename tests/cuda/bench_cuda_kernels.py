"""Time the llama kernels on the GPU (not a test; run by hand on the device):

    PYTHONPATH=src:tests/cuda python3 tests/cuda/bench_cuda_kernels.py

Each case is captured in a CUDA graph of REPS launches cycling through enough copies of its
inputs to defeat the 60 MB L2, replayed after a warm-up, timed with CUDA events (median of 5).
Prints one line per case: microseconds per launch and the bytes-moved rate."""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

import cuda_refs as R
from cuda_gpu import Gpu
from kern.runtime.devices.cuda import memory
from kern.runtime.devices.cuda.driver import call, drv, open_device
from kern.runtime.devices.cuda.graphs import capture
from kern.runtime.devices.cuda.launch import launch, launch_all

REPS = 20
L2_DEFEAT = 240 << 20


def copies(nbytes: int) -> int:
    return max(1, min(REPS, -(-L2_DEFEAT // max(nbytes, 1))))


def time_graph(gpu: Gpu, launches) -> float:
    """Median microseconds per launch group (len(launches) / REPS launches per group)."""
    g = capture(gpu.stream, lambda: launch_all(launches, gpu.stream), "bench")
    d = drv()
    start, stop = call("cuEventCreate", 0), call("cuEventCreate", 0)
    for _ in range(3):
        g.replay(gpu.stream)
    out = []
    for _ in range(5):
        call("cuEventRecord", start, gpu.stream.handle)
        g.replay(gpu.stream)
        call("cuEventRecord", stop, gpu.stream.handle)
        call("cuEventSynchronize", stop)
        out.append(call("cuEventElapsedTime", start, stop) * 1000 / REPS)
    g.destroy()
    del d
    return statistics.median(out)


def row(name: str, us: float, nbytes: float) -> str:
    return f"{name:<44} {us:9.2f} us  {nbytes / us / 1e3:8.1f} GB/s"


def bench_gemv(gpu: Gpu, rng, lines: list[str]) -> None:
    for name, N, K, entry in [("gemv qkv 3072x2048", 3072, 2048, "gemv_bf16"),
                              ("gemv o_proj 2048x2048", 2048, 2048, "gemv_bf16"),
                              ("gemv gate_up 16384x2048", 16384, 2048, "gemv_bf16"),
                              ("gemv down 2048x8192", 2048, 8192, "gemv_bf16"),
                              ("gemv_f32 lm_head 128256x2048", 128256, 2048, "gemv_f32")]:
        wbytes = N * K * 2
        ws = [gpu.put(R.rand_bf16(rng, (N, K), 0.05)) for _ in range(copies(wbytes))]
        x = gpu.put(R.rand_bf16(rng, (1, K)))
        y = gpu.empty(N * 4)
        ls = [gpu.make(entry, -(-N // 8), 256, x, ws[i % len(ws)], y, 1, N, K) for i in range(REPS)]
        lines.append(row(f"{name} rows=1", time_graph(gpu, ls), wbytes))
        for w in ws:
            w.free()
        gpu._bufs = [b for b in gpu._bufs if not b.freed]


def bench_attention(gpu: Gpu, rng, lines: list[str]) -> None:
    nq, nkv, hd, pt, n_layers = 32, 8, 64, 16, 1
    for ctx, split in [(1024, 32), (1024, 256), (4096, 64), (4096, 256), (16384, 128), (16384, 512)]:
        pps = ctx // pt
        state_bytes = pps * pt * n_layers * 2 * nkv * hd * 2
        n_copies = copies(state_bytes)
        states = [gpu.put(R.rand_bf16(rng, (pps, n_layers, 2, nkv, pt, hd))) for _ in range(n_copies)]
        table = gpu.put(np.arange(pps, dtype=np.int32))
        pos = gpu.put(np.array([ctx - 1], np.int32))
        q = gpu.put(R.rand_bf16(rng, (1, nq * hd)))
        n_splits = -(-ctx // split)
        po, pm, o = gpu.empty(nq * n_splits * hd * 4), gpu.empty(nq * n_splits * 8), gpu.empty(nq * hd * 2)
        ls = []
        for i in range(REPS):
            ls.append(gpu.make("attention_decode", (1, nkv, n_splits), 128, q, states[i % n_copies], table,
                               pos, po, pm, o, 1, pps, 0, n_layers, nq, nkv, hd, pt, split, nq * hd))
            ls.append(gpu.make("attention_combine", (1, nq), hd, po, pm, o, 1, nq, hd, n_splits))
        lines.append(row(f"attention_decode+combine ctx={ctx} split={split}", time_graph(gpu, ls), state_bytes))


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
    ls = []
    for _ in range(REPS):
        ls.append(gpu.make("argmax_partial", (128, 1), 256, logits, pv, pi, vocab, 1, 128))
        ls.append(gpu.make("argmax_final", 1, 32, pv, pi, tok, 1, 128))
    lines.append(row("argmax partial+final 1x128256", time_graph(gpu, ls), vocab * 4))


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


def bench_cublaslt(gpu: Gpu, rng, lines: list[str]) -> None:
    from kern.runtime.devices.cuda.cublaslt import CublasLt
    lt = CublasLt()
    for M, N, K in [(512, 2048, 8192), (2048, 16384, 2048), (4096, 4096, 4096)]:
        x, W, y = gpu.put(R.rand_bf16(rng, (M, K))), gpu.put(R.rand_bf16(rng, (N, K), 0.05)), gpu.empty(M * N * 2)
        for _ in range(3):
            lt.gemm_bf16_tn(x.ptr, W.ptr, y.ptr, M, N, K, gpu.stream)
        start, stop = call("cuEventCreate", 0), call("cuEventCreate", 0)
        call("cuEventRecord", start, gpu.stream.handle)
        for _ in range(20):
            lt.gemm_bf16_tn(x.ptr, W.ptr, y.ptr, M, N, K, gpu.stream)
        call("cuEventRecord", stop, gpu.stream.handle)
        call("cuEventSynchronize", stop)
        us = call("cuEventElapsedTime", start, stop) * 1000 / 20
        lines.append(f"{f'cublaslt bf16 TN {M}x{N}x{K}':<44} {us:9.2f} us  {2 * M * N * K / us / 1e6:8.1f} TFLOP/s")


def main() -> None:
    import importlib.util
    from cuda_kernel_docs import KERNEL_DIR
    spec = importlib.util.spec_from_file_location("b", KERNEL_DIR / "build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    out = Path(tempfile.mkdtemp())
    build.build(out)
    gpu = Gpu(open_device(0), out)
    rng = np.random.default_rng(0)
    lines: list[str] = [f"device: {gpu.device.name}, {gpu.device.multiprocessors} SMs"]
    for f in (bench_launch_overheads, bench_small, bench_gemv, bench_attention, bench_cublaslt):
        try:
            f(gpu, lines) if f is bench_launch_overheads else f(gpu, rng, lines)
        except Exception as e:  # noqa: BLE001 - report and go on to the next case
            lines.append(f"{f.__name__} failed: {e}")
        print(lines[-1], flush=True)
    print("\n".join(lines))
    gpu.close()


if __name__ == "__main__":
    main()
