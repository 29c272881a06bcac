"""The CUDA device: a thin layer over NVIDIA's driver API (`cuda-bindings`).

Nothing here imports CUDA at import time: `cuda.bindings` is imported on the first call that
needs the driver, so the CPU path never touches it. Without the bindings, the driver or a GPU,
`open_device()` raises `CudaUnavailable` saying which is missing.

Files: errors (error types), driver (init, context, checked calls), params (pure argument
packing and parameter-layout checks), memory (allocations, copies, streams), launch (modules,
kernels, launches), graphs (stream capture and replay per shape bucket), vmm (virtual-address
pool), cublaslt (bf16 GEMM through cuBLASLt).
"""

from kern.runtime.devices.cuda.errors import CudaError, CudaUnavailable, ParamLayoutError

__all__ = ["CudaError", "CudaUnavailable", "ParamLayoutError"]
