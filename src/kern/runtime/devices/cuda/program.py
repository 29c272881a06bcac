"""A lowered program on cuda (CudaDevice.lower): each shape bucket's launches resolved once, a
`graph` program captured once per bucket and replayed with one call, the staged inputs it reads
copied up as its first nodes, and run_steps' decode loop enqueued whole, the host waiting once.
Implements `kern.runtime.device.Program`."""

from __future__ import annotations

from math import prod

import numpy as np

from ....manifest.expr import evaluate
from ....manifest.schema import DTYPE_BYTES
from ...lower import LoweredLaunch, StateRef, View
from . import memory
from .cooperative import check_coresident
from .cublaslt import CUDA_R_16BF, CUDA_R_32F
from .driver import call, drv
from .graphs import Graph, capture
from .launch import PackedLaunch, launch

# The manifest's cuBLASLt externs (kern.manifest.limits.EXTERNS): the data type of their y.
EXTERN_OUT = {"extern:cublaslt_bf16_tn": CUDA_R_16BF, "extern:cublaslt_bf16_tn_f32": CUDA_R_32F}

_KIND = {"i32": "i32", "u32": "u32", "i64": "i64", "f32": "f32"}


class CudaProgram:
    """A lowered program on cuda: resolved launches per shape bucket, replayed as one graph
    launch when the program is a `graph` program."""

    runs_steps_natively = True  # run_steps enqueues every step before the host waits

    def __init__(self, dev, launches: list[LoweredLaunch], buffers, states, graph: bool):
        # dev: the CudaDevice lowering it (its stream, modules and cuBLASLt)
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
