"""Launch one many-row projection a few times (for ncu on the device): M N K [op].

    python3 -m bench.probes.gemm_one M N K [op]   (from the repository root)"""
import sys, tempfile
from pathlib import Path
import numpy as np
from kern.runtime.devices.cuda.driver import open_device
from kern.runtime.devices.cuda.launch import launch
from kern_models.llama.kernels.cuda import CUBINS, table
from tests.cuda import cuda_refs as R
from tests.cuda.cuda_gpu import Gpu, op_launches

M, N, K = (int(a) for a in sys.argv[1:4])
op = sys.argv[4] if len(sys.argv) > 4 else "norm_gemm"
out = Path(tempfile.mkdtemp()); CUBINS.provide(out)
gpu = Gpu(open_device(0), out)
rng = np.random.default_rng(0)
named = dict(W=gpu.put(R.rand_bf16(rng, (N, K), 0.05)), rows=M, N=N, K=K)
x = gpu.put(R.rand_bf16(rng, (M, K)))
if op.startswith("norm"):
    named.update(res=x, nw=gpu.put(R.rand_bf16(rng, (K,))), y=gpu.empty(M * N * 4), eps=1e-5)
else:
    named.update(x=x, res=gpu.put(R.rand_bf16(rng, (M, N))))
for _ in range(3):
    for la in op_launches(gpu, table.ops()[op], named):
        launch(la, gpu.stream)
gpu.stream.synchronize()
print("ok")
