"""The cuda device as the engine sees it: buffers in device memory, cubins loaded from bytes
with their parameter layouts checked, each program lowered to resolved launches, and `graph`
programs captured once per shape bucket and replayed with one call. Inputs are written into
pinned host mirrors and copied up by the program itself (inside its graph), so a decode step
is one graph launch and one synchronisation, plus the read of what the caller wants back.
Implements `kern.runtime.device.Device` and `Program`."""

from __future__ import annotations

from math import prod

import numpy as np

from ....manifest.expr import evaluate
from ....manifest.schema import DTYPE_BYTES
from ...dtypes import NP
from ...errors import DeviceError
from ...lower import LoweredLaunch, StateRef, View
from . import memory
from .driver import call, drv
from .errors import CudaUnavailable
from .graphs import Graph, capture
from .cooperative import check_coresident
from .cublaslt import CUDA_R_16BF, CUDA_R_32F
from .launch import Module, PackedLaunch, launch
from .tensormap import TensorMaps

# The manifest's cuBLASLt externs (kern.manifest.limits.EXTERNS): the data type of their y.
EXTERN_OUT = {"extern:cublaslt_bf16_tn": CUDA_R_16BF, "extern:cublaslt_bf16_tn_f32": CUDA_R_32F}


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

    def lower(self, launches: list[LoweredLaunch], buffers, states, graph: bool = False) -> "CudaProgram":
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


_KIND = {"i32": "i32", "u32": "u32", "i64": "i64", "f32": "f32"}


class CudaProgram:
    """A lowered program on cuda: resolved launches per shape bucket, replayed as one graph
    launch when the program is a `graph` program."""

    runs_steps_natively = True  # run_steps enqueues every step before the host waits

    def __init__(self, dev: CudaDevice, launches: list[LoweredLaunch], buffers, states, graph: bool):
        self.dev, self.planned, self.buffers, self.states = dev, launches, buffers, states
        self.graph = graph
        self._graphs: dict[tuple, Graph] = {}  # one captured graph per shape bucket
        self.kernels = []
        for l in launches:
            if l.entry.startswith("extern:"):
                self.kernels.append(None)
                continue
            kinds = ["ptr" if isinstance(a, (View, StateRef)) else _KIND[a.dtype] for a in l.args]
            self.kernels.append(dev.modules[l.module].kernel(l.entry, kinds))
        if graph and None in self.kernels:
            dev.blas  # made now: its workspace allocation cannot happen inside a graph capture
        self._cache: dict[tuple, list] = {}
        self._slots: dict[tuple, memory.PinnedHost] = {}
        # staged inputs this program reads, each with the views it reads them through
        self._views: dict[str, list[View]] = {}
        for l in launches:
            for a in l.args:
                if isinstance(a, View) and isinstance(buffers[a.buffer], memory.StagedBuffer):
                    self._views.setdefault(a.buffer, []).append(a)
        self._uploads: dict[tuple, list] = {}
        # tiled views' tensor maps, made now: before any graph capture
        self._maps = dev.tensor_maps.for_launches(launches, buffers)
        self._mark_buf: memory.DeviceBuffer | None = None
        self._old_marks: list[memory.DeviceBuffer] = []
        self._progress: memory.PinnedHost | None = None  # made by the first run_steps

    def _upload(self, env: dict[str, int]) -> None:
        """Copy up, from their mirrors, the staged inputs this program reads: as many bytes as
        its views of them reach at this step's shape (captured with the graph)."""
        key = tuple(sorted(env.items()))
        ups = self._uploads.get(key)
        if ups is None:
            ups = self._uploads[key] = []
            for name, views in self._views.items():
                b = self.buffers[name]
                end = max((evaluate(v.offset, env) + prod(evaluate(d, env) for d in v.shape))
                          * DTYPE_BYTES[v.dtype] for v in views)
                ups.append((b, min(end, b.nbytes)))
        for b, n in ups:
            b.upload(self.dev.stream, n)

    def _value(self, a, env):
        if isinstance(a, View):
            if a.tile is not None:  # the address of its tensor map
                return self._maps[id(a)]
            return self.buffers[a.buffer].ptr + evaluate(a.offset, env) * DTYPE_BYTES[a.dtype]
        if isinstance(a, StateRef):
            return self.states[a.state].ptr
        return a.at(env)

    def resolve(self, env: dict[str, int]) -> list:
        """The step's launches: PackedLaunches and library calls, every value resolved."""
        out: list = []
        for l, k in zip(self.planned, self.kernels):
            vals = [self._value(a, env) for a in l.args]
            if k is None and l.entry.startswith("extern:nccl_"):
                out.append(self.dev.collective(l.where, vals))
                continue
            if k is None:
                x, w, y, m, n, kk = vals
                o = EXTERN_OUT[l.entry]
                if self.graph:
                    self.dev.blas.plan(m, n, kk, o)  # picked now, outside any capture
                out.append(lambda s, x=x, w=w, y=y, m=m, n=n, kk=kk, o=o:
                           self.dev.blas.gemm_bf16_tn(x, w, y, m, n, kk, s, o))
                continue
            grid, block = tuple(evaluate(g, env) for g in l.grid), tuple(evaluate(b, env) for b in l.block)
            packed = PackedLaunch(k, grid, block, tuple(vals), shared_mem=evaluate(l.shared_mem, env),
                                  cooperative=l.cooperative, pdl=l.pdl)
            if l.cooperative:
                check_coresident(packed, self.dev.dev.multiprocessors, self.dev.name)
            out.append(packed)
        return out

    def _record(self, items: list) -> None:
        s = self.dev.stream
        for it in items:
            if isinstance(it, PackedLaunch):
                launch(it, s)
            else:
                it(s)

    def run(self, env: dict[str, int], wait: bool = True) -> None:
        key = tuple(sorted(env.items()))
        items = self._cache.get(key)
        if items is None:
            items = self._cache[key] = self.resolve(env)
        if self.graph:
            g = self._graphs.get(key)
            if g is None:  # first step of this bucket: capture the launch list, then replay it
                g = self._graphs[key] = capture(self.dev.stream, lambda: (self._upload(env), self._record(items)),
                                                label=repr(key))
            g.replay(self.dev.stream)
        else:
            self._upload(env)
            self._record(items)
        if wait:
            self.dev.stream.synchronize()

    def run_steps(self, env: dict[str, int], later: list[list[np.ndarray]], varying: list, feedback: list,
                  collect: list, each=None) -> list[list[np.ndarray]]:
        """1 + len(later) steps of this program in one go (Engine.run_steps): step j >= 1 first
        copies its own values of the `varying` inputs up from pinned slots, each step ends with
        the feedback copies (output -> input, on the device), its `collect` outputs copied down
        into pinned slots and then its number into a pinned progress word (copies on one stream
        land in order: the word at j + 1 says step j's outputs are on the host). A graph program
        captures all of it once per (bucket, steps) and replays it with one launch; the host
        waits once, at the end, or with `each` watches the word and hands over each step's
        outputs as they land."""
        k = 1 + len(later)
        marks = self._marks(k)
        if self._progress is None:
            self._progress = memory.PinnedHost(4, "step progress")
        progress = self._progress.array.view(np.int32)
        sizes = [a.nbytes for a in later[0]] if later else []
        for j, arrays in enumerate(later, start=1):
            for v, a in zip(varying, arrays):
                self._slot(("in", v.ptr), j, v.nbytes).array[:a.nbytes] = a.reshape(-1).view(np.uint8)
        for j in range(k):  # made before any capture: no host allocation while capturing
            for c, _ in collect:
                self._slot(("out", c.ptr), j, c.nbytes)
        s = self.dev.stream

        def record() -> None:
            for j in range(k):
                if j == 0:
                    self._upload(env)
                else:
                    for v, n in zip(varying, sizes):
                        if n:
                            call("cuMemcpyHtoDAsync", v.ptr, self._slot(("in", v.ptr), j, v.nbytes).ptr, n, s.handle)
                self._record(items)
                for src, dst, n in feedback:
                    if n:
                        call("cuMemcpyDtoDAsync", dst.ptr, src.ptr, n, s.handle)
                for c, n in collect:
                    if n:
                        call("cuMemcpyDtoHAsync", self._slot(("out", c.ptr), j, c.nbytes).ptr, c.ptr, n, s.handle)
                call("cuMemcpyDtoHAsync", self._progress.ptr, marks.ptr + 4 * j, 4, s.handle)

        key = tuple(sorted(env.items()))
        items = self._cache.get(key)
        if items is None:
            items = self._cache[key] = self.resolve(env)
        if self.graph:
            gkey = (key, k, tuple(v.ptr for v in varying), tuple(sizes),
                    tuple((a.ptr, b.ptr, n) for a, b, n in feedback), tuple((c.ptr, n) for c, n in collect))
            g = self._graphs.get(gkey)
            if g is None:
                g = self._graphs[gkey] = capture(s, record, label=f"{key!r} x{k}")
        progress[0] = 0
        if self.graph:
            g.replay(s)
        else:
            record()
        if each is None:
            s.synchronize()
        outs = []
        for j in range(k):
            if each is not None:
                self._await(progress, j)
            outs.append([self._slot(("out", c.ptr), j, c.nbytes).array[:n].copy() for c, n in collect])
            if each is not None:
                each(j, outs[-1])
        s.synchronize()
        return outs

    def _await(self, progress: np.ndarray, j: int) -> None:
        """Spin until step j's mark lands (a step is ~1 ms: waking from a sleep costs more than
        it saves); a stream that stopped short of it (a failed launch) is left to synchronize,
        which raises its error."""
        n = 0
        while progress[0] <= j:
            n += 1
            if n % 4096 == 0 and drv().cuStreamQuery(self.dev.stream.handle)[0] != \
                    drv().CUresult.CUDA_ERROR_NOT_READY:
                if progress[0] <= j:
                    self.dev.stream.synchronize()
                return

    def close(self) -> None:
        """Its graphs destroyed and its own device and pinned memory freed (CudaDevice.close:
        the buffers and states it reads are the device's to free)."""
        for g in self._graphs.values():
            g.destroy()
        self._graphs.clear()
        for slot in self._slots.values():
            slot.free()
        self._slots.clear()
        for b in [self._mark_buf, *self._old_marks]:
            if b is not None:
                b.free()
        self._mark_buf, self._old_marks = None, []
        if self._progress is not None:
            self._progress.free()
            self._progress = None

    def _marks(self, k: int) -> memory.DeviceBuffer:
        """Device int32s 1..k (what each step copies into the progress word), made before any
        capture and kept: captured graphs hold their address."""
        if self._mark_buf is None or self._mark_buf.nbytes < 4 * k:
            if self._mark_buf is not None:
                self._old_marks.append(self._mark_buf)  # graphs captured earlier still read it
            self._mark_buf = memory.alloc(4 * max(k, 16), "step marks")
            memory.copy_to_device(self._mark_buf.ptr, np.arange(1, max(k, 16) + 1, dtype=np.int32))
        return self._mark_buf

    def _slot(self, tag: tuple, j: int, nbytes: int) -> memory.PinnedHost:
        """Pinned host slot j of `tag` (an input's per-step values, an output's per-step copy),
        the size of the whole buffer, made once and kept: captured graphs hold its address."""
        slot = self._slots.get((tag, j))
        if slot is None:
            slot = self._slots[(tag, j)] = memory.PinnedHost(nbytes, f"{tag[0]} slot {j}")
        return slot
