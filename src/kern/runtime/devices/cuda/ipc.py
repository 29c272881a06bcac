"""CUDA IPC: a buffer of this process made reachable from another process's kernels on the same
host (one process a rank). The handle travels as hex; the opened address is peer memory."""

from __future__ import annotations

from .driver import call, drv

LAZY_PEER_ACCESS = 1  # CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS


def export(ptr: int) -> str:
    """The IPC handle of the allocation at ptr, as hex."""
    handle = call("cuIpcGetMemHandle", ptr, where=f"buffer at {ptr:#x}")
    return bytes(handle.reserved).hex()


def open(handle_hex: str) -> int:
    """The address in this process of another process's exported allocation."""
    h = drv().CUipcMemHandle()
    h.reserved = bytes.fromhex(handle_hex)
    return int(call("cuIpcOpenMemHandle", h, LAZY_PEER_ACCESS, where="a peer rank's buffer"))
