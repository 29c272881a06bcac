"""Without a GPU the CUDA device fails with a clear CudaUnavailable, and the CPU path never
imports CUDA."""

import subprocess
import sys

from kern.runtime.devices.cuda import CudaUnavailable
from kern.runtime.devices.cuda.driver import open_device


def test_importing_the_device_layer_imports_no_cuda():
    code = ("import sys; import kern.runtime.devices.cuda as c; "
            "from kern.runtime.devices.cuda import driver, memory, launch, graphs, vmm, cublaslt, params; "
            "assert not any(m == 'cuda' or m.startswith('cuda.') for m in sys.modules), "
            "[m for m in sys.modules if m.startswith('cuda')]")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_open_device_either_works_or_says_what_is_missing():
    try:
        dev = open_device(0)
    except CudaUnavailable as e:
        msg = str(e)
        assert "cuda-bindings" in msg or "driver" in msg or "GPU" in msg, msg
    else:
        assert dev.multiprocessors > 0
