"""Device limits the verifier checks launches against, and the extern library calls."""

from __future__ import annotations

INT32_MAX = 2**31 - 1
MAX_BYTES = 2**63 - 1

# Per target device: block dims, threads per block, grid dims, shared memory per block.
CUDA = {
    "block": (1024, 1024, 64),
    "threads": 1024,
    "grid": (2**31 - 1, 65535, 65535),
    "shared_mem": 232448,  # 227 KiB opt-in on sm_90
}

# Library calls the runtime makes itself: the param kinds they take, in order, and which
# positions they write. No geometry.
EXTERNS: dict[str, tuple[tuple[str, ...], tuple[int, ...]]] = {
    # y[M, N] = x[M, K] @ W[N, K]^T, bf16 in and out, fp32 accumulation.
    "cublaslt_bf16_tn": (("buffer", "buffer", "buffer", "scalar", "scalar", "scalar"), (2,)),
}
