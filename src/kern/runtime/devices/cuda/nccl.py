"""NCCL through ctypes, loaded on first use: the all-reduce of large messages (prefill) in split
deployments. The library comes from the nvidia-nccl wheel (site-packages/nvidia/nccl/lib) or
the system (ldconfig), or from $KERN_NCCL_LIBRARY. NVLink SHARP (multicast objects) stays off:
NCCL_NVLS_ENABLE=0 is set before NCCL reads its environment, and nothing here calls
cuMulticastCreate."""

from __future__ import annotations

import ctypes
import os
import sys
from functools import cache
from pathlib import Path

from ...errors import DeviceError

BFLOAT16 = 9  # ncclBfloat16
SUM = 0  # ncclSum
ID_BYTES = 128  # NCCL_UNIQUE_ID_BYTES


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * ID_BYTES)]


def _candidates() -> list[str]:
    env = os.environ.get("KERN_NCCL_LIBRARY")
    wheels = [str(p) for d in sys.path if d for p in sorted(Path(d).glob("nvidia/nccl*/lib/libnccl.so*"))]
    return [*([env] if env else []), *wheels, "libnccl.so.2"]


@cache
def lib() -> ctypes.CDLL:
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    tried = []
    for path in _candidates():
        try:
            nccl = ctypes.CDLL(path)
        except OSError as exc:
            tried.append(f"{path} ({exc})")
            continue
        nccl.ncclGetErrorString.restype = ctypes.c_char_p
        return nccl
    raise DeviceError("a split deployment calls NCCL, but libnccl.so.2 cannot be loaded (tried "
                      f"{'; '.join(tried[:4])}): pip install nvidia-nccl-cu13, or set KERN_NCCL_LIBRARY")


def _check(code: int, what: str) -> None:
    if code != 0:
        raise DeviceError(f"NCCL {what} failed: {lib().ncclGetErrorString(code).decode()} [{code}]")


class Communicator:
    """One rank's NCCL communicator."""

    def __init__(self, handle: ctypes.c_void_p, rank: int):
        self.handle, self.rank = handle, rank

    def all_reduce_sum_bf16(self, ptr: int, n: int, stream) -> None:
        """x[:n] summed over the ranks in place (bf16), enqueued on `stream` (capturable)."""
        _check(lib().ncclAllReduce(ctypes.c_void_p(ptr), ctypes.c_void_p(ptr), ctypes.c_size_t(n), BFLOAT16, SUM,
                                   self.handle, ctypes.c_void_p(int(stream))), f"all-reduce on rank {self.rank}")


def init_all(ordinals: list[int]) -> list[Communicator]:
    """The communicators of one process driving the GPUs `ordinals` (ncclCommInitAll)."""
    n = len(ordinals)
    comms = (ctypes.c_void_p * n)()
    _check(lib().ncclCommInitAll(comms, n, (ctypes.c_int * n)(*ordinals)), f"init of {n} ranks")
    return [Communicator(ctypes.c_void_p(comms[r]), r) for r in range(n)]


def unique_id() -> bytes:
    """A new communicator id (rank 0 makes it; every rank joins with it)."""
    uid = UniqueId()
    _check(lib().ncclGetUniqueId(ctypes.byref(uid)), "unique id")
    return ctypes.string_at(ctypes.addressof(uid), ID_BYTES)


def init_rank(ranks: int, uid: bytes, rank: int) -> Communicator:
    """This process's rank of a communicator of `ranks` processes (ncclCommInitRank)."""
    u = UniqueId()
    ctypes.memmove(ctypes.addressof(u), uid, ID_BYTES)
    comm = ctypes.c_void_p()
    _check(lib().ncclCommInitRank(ctypes.byref(comm), ranks, u, rank), f"init of rank {rank} of {ranks}")
    return Communicator(comm, rank)
