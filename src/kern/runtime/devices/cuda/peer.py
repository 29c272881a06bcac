"""Peer access between the GPUs of one process: rank r's kernels read and write the buffers of
the other ranks' GPUs directly (over NVLink on an HGX board), which the peer all-reduce needs."""

from __future__ import annotations

from .driver import GpuContext, call, check, drv
from .errors import CudaUnavailable

ALREADY_ENABLED = 704  # CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED


def enable(gpu: GpuContext, others: list[GpuContext]) -> None:
    """Let `gpu`'s context reach every context of `others` (made current on this thread first)."""
    call("cuCtxSetCurrent", gpu.context, where=f"device {gpu.ordinal}")
    for o in others:
        if not call("cuDeviceCanAccessPeer", gpu.handle, o.handle):
            raise CudaUnavailable(f"GPU {gpu.ordinal} cannot reach GPU {o.ordinal}'s memory (no peer access): a "
                                  "split deployment's peer all-reduce needs GPUs linked by NVLink or PCIe peer access")
        result = drv().cuCtxEnablePeerAccess(o.context, 0)
        err = result[0] if isinstance(result, tuple) else result
        if int(err) != ALREADY_ENABLED:
            check(result, "cuCtxEnablePeerAccess", f"device {gpu.ordinal} -> device {o.ordinal}")
