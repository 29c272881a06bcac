"""Device memory and streams: allocate, free, copy (H2D, D2H, D2D), set bytes.

Device addresses are plain ints. Host buffers are numpy arrays (C-contiguous) or bytes.
With a stream, copies and memsets are enqueued on it (host buffers are pageable, so the host side
is done when the call returns); `copy_to_host` synchronises before returning. With no stream,
each call is synchronous: it runs on the default stream and waits for the whole context.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kern.runtime.devices.cuda.driver import call, drv


class Stream:
    """A non-blocking CUDA stream (graph capture needs one)."""

    def __init__(self) -> None:
        flags = drv().CUstream_flags.CU_STREAM_NON_BLOCKING
        self.handle = call("cuStreamCreate", flags)

    def synchronize(self) -> None:
        call("cuStreamSynchronize", self.handle, where="stream")

    def destroy(self) -> None:
        if self.handle is not None:
            call("cuStreamDestroy", self.handle)
            self.handle = None


@dataclass(slots=True)
class DeviceBuffer:
    """`nbytes` of device memory at `ptr` (cuMemAlloc)."""

    ptr: int
    nbytes: int
    label: str = ""
    freed: bool = field(default=False)

    def free(self) -> None:
        if not self.freed:
            call("cuMemFree", self.ptr, where=f"buffer {self.label!r}")
            self.freed = True


class PinnedHost:
    """`nbytes` of page-locked host memory (cuMemHostAlloc) seen as a numpy byte array. Copies
    from and to it are true DMA: asynchronous, and they can be captured in a graph."""

    def __init__(self, nbytes: int, label: str = ""):
        import ctypes

        self.nbytes, self.label = nbytes, label
        self.ptr = int(call("cuMemHostAlloc", nbytes, 0, where=f"pinned {label!r}, {nbytes} bytes"))
        self.array = np.frombuffer((ctypes.c_uint8 * nbytes).from_address(self.ptr), np.uint8)

    def free(self) -> None:
        if self.ptr:
            self.array = None
            call("cuMemFreeHost", self.ptr, where=f"pinned {self.label!r}")
            self.ptr = 0


@dataclass(slots=True)
class StagedBuffer:
    """A device buffer the host writes through a pinned mirror: writes land in the mirror, and
    the programs that read the buffer copy the mirror up at their start (inside their graph).
    For buffers only the caller writes (inputs), so the mirror always holds what the device
    will hold."""

    device: DeviceBuffer
    host: PinnedHost

    @property
    def ptr(self) -> int:
        return self.device.ptr

    @property
    def nbytes(self) -> int:
        return self.device.nbytes

    def upload(self, stream: Stream, nbytes: int | None = None) -> None:
        """Copy the mirror's first `nbytes` (default: all) up to the device buffer."""
        n = self.nbytes if nbytes is None else nbytes
        if n > 0:
            call("cuMemcpyHtoDAsync", self.device.ptr, self.host.ptr, n, stream.handle,
                 where=f"upload of {self.device.label!r}")


def alloc(nbytes: int, label: str = "") -> DeviceBuffer:
    if nbytes <= 0:
        raise ValueError(f"buffer {label!r}: cannot allocate {nbytes} bytes")
    ptr = call("cuMemAlloc", nbytes, where=f"buffer {label!r}, {nbytes} bytes")
    return DeviceBuffer(int(ptr), nbytes, label)


def _host(arr: Any) -> tuple[int, int, Any]:
    """(address, nbytes, keep-alive) of a C-contiguous host buffer."""
    if isinstance(arr, (bytes, bytearray, memoryview)):
        arr = np.frombuffer(arr, dtype=np.uint8)
    if not isinstance(arr, np.ndarray) or not arr.flags.c_contiguous:
        raise TypeError("host buffers must be C-contiguous numpy arrays or bytes")
    return int(arr.ctypes.data), arr.nbytes, arr


def _stream(stream: Stream | None) -> Any:
    return stream.handle if stream is not None else 0


def copy_to_device(dst: int, src: Any, stream: Stream | None = None) -> None:
    addr, n, _keep = _host(src)
    if n:
        call("cuMemcpyHtoDAsync", dst, addr, n, _stream(stream), where=f"H2D {n} bytes to {dst:#x}")
    if stream is None:
        call("cuCtxSynchronize")


def copy_to_host(dst: np.ndarray, src: int, stream: Stream | None = None) -> np.ndarray:
    """Fill `dst` from device address `src` (dst.nbytes bytes) and return it."""
    addr, n, _keep = _host(dst)
    if not dst.flags.writeable:
        raise TypeError("copy_to_host needs a writeable array")
    if n:
        call("cuMemcpyDtoHAsync", addr, src, n, _stream(stream), where=f"D2H {n} bytes from {src:#x}")
    if stream is not None:
        stream.synchronize()
    else:
        call("cuCtxSynchronize")
    return dst


def copy_device(dst: int, src: int, nbytes: int, stream: Stream | None = None) -> None:
    if nbytes:
        call("cuMemcpyDtoDAsync", dst, src, nbytes, _stream(stream),
             where=f"D2D {nbytes} bytes {src:#x} -> {dst:#x}")
    if stream is None:
        call("cuCtxSynchronize")


def memset(dst: int, byte: int, nbytes: int, stream: Stream | None = None) -> None:
    if nbytes:
        call("cuMemsetD8Async", dst, byte & 0xFF, nbytes, _stream(stream),
             where=f"memset {nbytes} bytes at {dst:#x}")
    if stream is None:
        call("cuCtxSynchronize")
