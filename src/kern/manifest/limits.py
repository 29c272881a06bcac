"""Limits: device limits launches are checked against, the extern library calls, and a bound on
every count a manifest gives, so that no number in a manifest makes verification (or a load
that follows it) allocate or loop in proportion to it."""

from __future__ import annotations

INT32_MAX = 2**31 - 1
MAX_BYTES = 2**63 - 1

MAX_MANIFEST_BYTES = 256 << 20  # a 64-layer manifest is ~2 MB
MAX_DEPTH = 48
"""JSON nesting: an expression inside a call's view sits 7 levels deep; no generator nests
expressions 40 levels. Checked before typed validation, which recurses."""
MAX_VAR = INT32_MAX  # a var's max: vars fill 32-bit scalars
MAX_DIMS = 8  # dimensions of a buffer shape
MAX_RANKS = 4096  # topology.ranks

# What the runtime allocates at load (buffers at the var maxima, the least of each state) must
# fit one device of the target: the largest NVIDIA GPU's memory (B200), or a large host's. What
# fits here but not on this machine is the engine's refusal at load, naming the buffer.
MEMORY = {"cuda": 192 << 30, "cpu": 1 << 40}

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
    # The same with an fp32 y (logits).
    "cublaslt_bf16_tn_f32": (("buffer", "buffer", "buffer", "scalar", "scalar", "scalar"), (2,)),
    # x[:n] summed in place over the manifest's ranks (NCCL), bf16. Needs 2 or more ranks.
    "nccl_all_reduce_sum_bf16": (("buffer", "scalar"), (0,)),
}
COLLECTIVE_EXTERNS = ("nccl_all_reduce_sum_bf16",)
