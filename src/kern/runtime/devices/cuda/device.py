"""The cuda device as the engine sees it: buffers in device memory, cubins loaded from bytes
with their parameter layouts checked, each program lowered to resolved launches, and `graph`
programs captured once per shape bucket and replayed with one call. Inputs are written into
pinned host mirrors and copied up by the program itself (inside its graph), so a decode step
is one graph launch and one synchronisation, plus the read of what the caller wants back.
Implements `kern.runtime.device.Device` (its programs: program.py)."""

from __future__ import annotations

import numpy as np

from ....manifest.schema import DTYPE_BYTES
from ...dtypes import NP
from ...errors import DeviceError
from ...lower import LoweredLaunch
from . import memory
from .driver import call
from .errors import CudaUnavailable
from .launch import Module
from .program import CudaProgram
from .tensormap import TensorMaps


class CudaDevice:
    kind = "cuda"
    closed = False  # close() sets it

    def __init__(self, arch: str | None = None, ordinal: int = 0):
        from .driver import open_device

        try:
            self.dev = open_device(ordinal)
        except CudaUnavailable as exc:
            raise DeviceError(f"manifest targets cuda {arch or ''}: {exc}") from None
        cc = self.dev.compute_capability
        if arch and arch.startswith("sm_") and arch[3:5] != f"{cc[0]}{cc[1]}":
            raise DeviceError(f"manifest targets {arch}, but {self.dev.name} is sm_{cc[0]}{cc[1]}")
        # open_device is once per process, but a context is current per thread: the thread that
        # builds the device (a server's engine thread) may not be the one that first opened it.
        call("cuCtxSetCurrent", self.dev.context, where=f"device {ordinal}")
        self.name = self.dev.name
        self.stream = memory.Stream()
        self.modules: dict[str, Module] = {}
        self._blas = None
        self.tensor_maps = TensorMaps()  # the tiled views' maps (tensormap.py), made as programs are
        self._bounce_bytes = 1 << 20  # reads up to this size go through pinned memory
        self._bounce = memory.PinnedHost(self._bounce_bytes, "read bounce")
        self.communicator = None  # NCCL, set by kern.world.ranks for a split deployment
        # what close() gives back, a release call an allocation in the order they were made (the
        # driver frees nothing of a dropped object: every buffer is freed by name or never)
        self._owned: list = []

    @property
    def blas(self):
        if self._blas is None:
            from .cublaslt import CublasLt

            self._blas = CublasLt()
            self._own(self._blas.close)
        return self._blas

    def load_module(self, name: str, data: bytes) -> None:
        self.modules[name] = Module(data, name)

    def alloc(self, dtype: str, nelems: int, staged: bool = False):
        """Every buffer starts as zeros, as on the cpu device (kernels may rely on it, e.g. a
        counter that each launch leaves as it found it). A `staged` buffer (one only the caller
        writes: an input) is written through a pinned host mirror that each program reading it
        copies up first, inside its graph: a step's inputs cost no copy call of their own."""
        self._open()
        buf = memory.alloc(max(nelems * DTYPE_BYTES[dtype], 16), dtype)
        self._own(buf.free)
        memory.memset(buf.ptr, 0, buf.nbytes)
        if staged:
            host = memory.PinnedHost(buf.nbytes, dtype)
            self._own(host.free)
            host.array[:] = 0
            return memory.StagedBuffer(buf, host)
        return buf

    @property
    def chunk_granularity(self) -> int:
        from .vmm import granularity

        return granularity(self.dev)

    def alloc_state(self, nbytes: int, chunk_bytes: int | None = None):
        """A state's memory: with chunk_bytes, a virtual range of that many-byte chunks into
        which the pool's plans map chunks of the device's one set of physical chunks (made with
        the first such state: every pooled state's range spans the same dynamic chunks, and
        all of them together hold the budget once); else one plain allocation."""
        if chunk_bytes:
            from .vmm import PhysicalChunks, VirtualPool

            self._open()
            n = nbytes // chunk_bytes
            shared = getattr(self, "physical", None)
            if shared is None:
                shared = self.physical = PhysicalChunks(self.dev, chunk_bytes, n)
                self._own(shared.release)  # after every range mapping its chunks (released first)
            elif (shared.chunk_bytes, shared.n_chunks) != (chunk_bytes, n):
                raise DeviceError(f"a pooled state of {n} chunks of {chunk_bytes} bytes: this device's states share "
                                  f"{shared.n_chunks} chunks of {shared.chunk_bytes} bytes")
            pool = VirtualPool(self.dev, n_slots=n, chunks=shared)
            self._own(pool.release)
            return MappedState(pool)
        self._open()
        buf = memory.alloc(nbytes, "state")
        self._own(buf.free)
        memory.memset(buf.ptr, 0, nbytes)
        return buf

    def remap(self, storage, unmap: list[int], map: list[tuple[int, int]]) -> None:
        if isinstance(storage, MappedState):
            storage.pool.apply(unmap=unmap, map=map)

    def write(self, storage, host: np.ndarray, offset: int = 0) -> None:
        """Write `host` at element `offset` of `storage` (a staged buffer: into its mirror,
        uploaded by the next run)."""
        host = np.ascontiguousarray(host)
        at = offset * host.itemsize
        if isinstance(storage, memory.StagedBuffer):
            if at + host.nbytes > storage.nbytes:
                raise DeviceError(f"write of {host.nbytes} bytes at byte {at} into a {storage.nbytes}-byte buffer")
            storage.host.array[at:at + host.nbytes] = host.reshape(-1).view(np.uint8)
            return
        memory.copy_to_device(storage.ptr + at, host, self.stream)

    def read(self, storage, dtype: str, shape: tuple[int, ...], offset: int = 0) -> np.ndarray:
        """A copy of prod(shape) elements from element `offset`, through a pinned bounce buffer
        (a staged buffer is read from its mirror, which is what the device holds or will hold)."""
        out = np.empty(shape, NP[dtype])
        flat = out.reshape(-1).view(np.uint8)
        at = offset * out.itemsize
        if isinstance(storage, memory.StagedBuffer):
            flat[:] = storage.host.array[at:at + out.nbytes]
            return out
        if out.nbytes > self._bounce_bytes:
            return memory.copy_to_host(out, storage.ptr + at, self.stream)
        if out.nbytes:
            call("cuMemcpyDtoHAsync", self._bounce.ptr, storage.ptr + at, out.nbytes, self.stream.handle,
                 where=f"D2H {out.nbytes} bytes from {storage.ptr + at:#x}")
            self.stream.synchronize()
            flat[:] = self._bounce.array[:out.nbytes]
        return out

    def address(self, storage) -> int:
        return storage.ptr

    def copy_bytes(self, storage, dst: int, src: int, n: int) -> None:
        memory.copy_device(storage.ptr + dst, storage.ptr + src, n, self.stream)

    def collective(self, where: str, vals: list):
        """The launch of an NCCL extern (an in-place bf16 sum of x[:n] over the ranks)."""
        if self.communicator is None:
            raise DeviceError(f"{where}: an NCCL all-reduce needs every rank of the split deployment loaded "
                              "together (kern.world.ranks); this device has no communicator")
        x, n = vals
        return lambda s, comm=self.communicator: comm.all_reduce_sum_bf16(x, n, s.handle)

    def lower(self, launches: list[LoweredLaunch], buffers, states, graph: bool = False) -> CudaProgram:
        self._open()
        program = CudaProgram(self, launches, buffers, states, graph)
        self._own(program.close)
        return program

    def synchronize(self) -> None:
        self.stream.synchronize()

    def memory(self) -> tuple[int, int]:
        free, total = call("cuMemGetInfo", where="device memory")
        return int(free), int(total)

    def _own(self, release) -> None:
        self.__dict__.setdefault("_owned", []).append(release)  # (a device made without __init__: tests' stand-ins)

    def _open(self) -> None:
        if self.closed:
            raise DeviceError(f"device {self.name}: closed (its memory given back); open a new engine")

    def close(self) -> None:
        """Give back everything this device holds, once its work is done: programs (their graphs
        and pinned slots), buffers, states (the ranges before the chunks they map), cuBLASLt,
        the tensor maps, the modules, the stream. Newest first, each release once; a second
        close does nothing, and an allocation or a lowering afterwards is refused."""
        if self.closed:
            return
        self.closed = True
        # the context is current per thread: the thread closing may not be the one that built it
        call("cuCtxSetCurrent", self.dev.context, where="device close")
        self.stream.synchronize()
        owned = self.__dict__.get("_owned", [])
        while owned:
            owned.pop()()
        self.physical = None
        self.tensor_maps.free()
        self._bounce.free()
        for m in self.modules.values():
            m.unload()
        self.modules.clear()
        self.stream.destroy()


class MappedState:
    """A state in a virtual-address range (cuMemAddressReserve) whose chunks are mapped
    (cuMemCreate / cuMemMap) as the pool's plans say."""

    def __init__(self, pool):
        self.pool = pool
        self.ptr = pool.base
