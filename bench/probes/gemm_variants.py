"""Time gemm.cu's prefill GEMM built from variant sources (bench/probes/var_*/, each a copy of
gemm.cu and its headers with one change) beside the shipped one and cuBLASLt: one line a
(variant, shape). Run on the device from the repository root (after bench/tensor_core_gpu.sh's
install): python3 -m bench.probes.gemm_variants"""
import subprocess, tempfile
from pathlib import Path
import numpy as np
from kern.runtime.devices.cuda.driver import open_device
from kern.runtime.devices.cuda.cublaslt import CublasLt
from kern_models.llama.kernels.cuda import CUBINS, table
from tests.cuda import cuda_refs as R
from tests.cuda.bench_cuda_kernels import cublaslt_us, time_graph, REPS
from tests.cuda.cuda_gpu import Gpu
ROOT = Path(__file__).resolve().parents[2]

dev = open_device(0)
dirs = {"shipped": None, **{p.name[4:]: p for p in sorted((ROOT / "bench/probes").glob("var_*"))}}
lt = CublasLt()
rng = np.random.default_rng(0)
for M, N, K, entry in [(2048, 16384, 2048, "norm_gemm_bf16"), (2048, 2048, 8192, "gemm_residual")]:
    results = []
    for name, d in dirs.items():
        out = Path(tempfile.mkdtemp())
        if d is None:
            CUBINS.provide(out)
        else:
            subprocess.run(["nvcc", *CUBINS.flags(), "-I", ".", "gemm.cu", "-o", str(out / "gemm.cubin")], cwd=d,
                           check=True, capture_output=True)
        gpu = Gpu(dev, out)
        x, W, y = gpu.put(R.rand_bf16(rng, (M, K))), gpu.put(R.rand_bf16(rng, (N, K), 0.05)), gpu.empty(M * N * 4)
        rs = gpu.put(np.ones(M, np.float32))
        grid = (-(-N // 128), -(-M // 128))
        args = (x, rs, W, y, M, N, K) if entry.startswith("norm") else (x, W, y, M, N, K)
        us = time_graph(gpu, [gpu.make(entry, grid, 384, *args, shared_mem=table.TILES["WG_BIG_SMEM"])
                              for _ in range(REPS)])
        results.append(f"{name} {us:8.1f} us {2 * M * N * K / us / 1e6:6.1f} TF")
        if d is None:
            lt_us = cublaslt_us(lt, gpu, x, W, y, M, N, K)
            results.append(f"cublaslt {lt_us:8.1f} us {2 * M * N * K / lt_us / 1e6:6.1f} TF")
    print(f"{entry} {M}x{N}x{K}: " + " | ".join(results), flush=True)
