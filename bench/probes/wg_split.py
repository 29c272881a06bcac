r"""The wide decode's split projections (gemm.cu's *_split ops, as the manifest runs them: rms_prep
then the GEMM) from this tree's cubins beside a build of before (--before DIR: a gemm.cubin):
microseconds an op at the wide decode's row counts for the Llama-3.2-1B and Llama-3.1-8B
projection shapes (qkv* is the plain bf16 op at QKV's shape: the rope op's tiles are the same
blocks), weights in enough copies that L2 holds none of them (a decode step streams every
layer's), this tree's unsplit twin beside them (prefill's 128-row blocks over all of K: what
SPLIT_BELOW_TILES in models/llama/manifests/cuda.py picks for the wider projections), and whether
all three give the same bytes. One line a (shape, rows).

A variant of gemm_wg.cuh's split: keep this tree's cubins (`CUBINS.provide(Path('/tmp/before'))`),
change the kernel, reinstall the tree (its cubins are rebuilt by nvcc) and run with --before
/tmp/before (bench/wide_decode_gpu.sh is the one-call form; the cluster-summed split of
2026-12-05 lost this way: docs/perf-history.md). Without --before both columns are this tree's."""
import argparse, tempfile
from pathlib import Path

import numpy as np

from kern.runtime.devices.cuda.driver import open_device
from kern_models.llama.kernels.cuda import CUBINS, table
from tests.cuda import cuda_refs as R
from tests.cuda.bench_cuda_kernels import REPS, copies
from tests.cuda.cuda_gpu import Gpu, op_launches

OPS = table.ops()
SHAPES = [  # (model, name, op, N, K): the swiglu op's N is the intermediate width (2N W rows)
    ("1b", "qkv*", "norm_gemm_split", 3072, 2048), ("1b", "o", "gemm_residual_split", 2048, 2048),
    ("1b", "gate_up", "norm_gemm_swiglu_split", 8192, 2048), ("1b", "down", "gemm_residual_split", 2048, 8192),
    ("8b", "qkv*", "norm_gemm_split", 6144, 4096), ("8b", "o", "gemm_residual_split", 4096, 4096),
    ("8b", "gate_up", "norm_gemm_swiglu_split", 14336, 4096), ("8b", "down", "gemm_residual_split", 4096, 14336),
]
ROWS = (16, 32, 64, 128)


def builds(before: str | None) -> dict[str, Path]:
    now = Path(tempfile.mkdtemp())
    CUBINS.provide(now)
    return {"before": Path(before) if before else now, "now": now}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", help="a folder holding the gemm.cubin to time beside this tree's")
    args = ap.parse_args()
    if args.before and not (Path(args.before) / "gemm.cubin").is_file():
        ap.error(f"--before {args.before}: no gemm.cubin there (CUBINS.provide writes one: the docstring's recipe)")
    dev = open_device(0)
    gpus = {k: Gpu(dev, d) for k, d in builds(args.before).items()}
    rng = np.random.default_rng(0)
    for model, name, op, N, K in SHAPES:
        wrows = 2 * N if "swiglu" in op else N
        W = R.rand_bf16(rng, (wrows, K), 0.05)
        for rows in ROWS:
            x = R.rand_bf16(rng, (rows, K), 2.0)
            res0 = R.rand_bf16(rng, (rows, N), 4.0)
            us, outs = {}, {}
            # (label, build, op): the split op of both builds, and this tree's unsplit twin (what
            # models/llama/manifests/cuda.py's SPLIT_BELOW_TILES picks for wider projections)
            for label, gpu, which in (("before", gpus["before"], op), ("now", gpus["now"], op),
                                      ("unsplit", gpus["now"], op.removesuffix("_split"))):
                n_copies = copies(W.nbytes)
                Ws = [gpu.put(W) for _ in range(n_copies)]
                dnw = gpu.put(R.rand_bf16(np.random.default_rng(1), (K,)))
                launches, first = [], None
                for i in range(REPS):
                    if which.startswith("gemm_residual"):
                        named = dict(x=gpu.put(x), W=Ws[i % n_copies], res=gpu.put(res0), rows=rows, N=N, K=K)
                        out = named["res"]
                    else:
                        out = gpu.empty(rows * N * 2)
                        named = dict(res=gpu.put(x), nw=dnw, W=Ws[i % n_copies], rows=rows, N=N, K=K, eps=1e-5,
                                     **({"act": out} if "swiglu" in which else {"y": out}))
                    launches += op_launches(gpu, OPS[which], named)
                    first = out if first is None else first
                us[label] = gpu.graph_ms(launches, REPS) * 1000
                outs[label] = gpu.get(first, np.uint16, (rows, N))
            same = "same bytes" if all(np.array_equal(outs["before"], o) for o in outs.values()) else "DIFFERENT BYTES"
            gbps = W.nbytes / us["now"] / 1e3
            print(f"{model} {name:<8} rows {rows:>3}: split before {us['before']:8.2f} us  now {us['now']:8.2f} us  "
                  f"({us['before'] / us['now']:.2f}x, {gbps:7.1f} GB/s of weights)  unsplit {us['unsplit']:8.2f} us  "
                  f"{same}", flush=True)

if __name__ == "__main__":
    main()
