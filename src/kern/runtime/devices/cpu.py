"""The cpu device: the reference device. Its modules are Python source pinned by sha256;
their functions get numpy views of the buffers, shaped for the current step. Implements
`kern.runtime.device.Device` and `Program`."""

from __future__ import annotations

import types
from collections.abc import Callable
from math import prod

import numpy as np

from ...manifest.expr import evaluate
from ..dtypes import NP
from ...files.errors import ModuleError
from ..errors import DeviceError, LaunchError
from ..lower import LoweredLaunch, StateRef, View


class CpuDevice:
    kind = "cpu"
    chunk_granularity = 1  # host memory is fully backed: any chunk size maps

    def __init__(self) -> None:
        self.modules: dict[str, types.ModuleType] = {}
        self.closed = False

    def close(self) -> None:
        """Host memory is the engine's numpy arrays, freed with them: only the modules go."""
        self.closed = True
        self.modules.clear()

    def load_module(self, name: str, data: bytes) -> None:
        mod = types.ModuleType(f"kern_module_{name}")
        exec(compile(data, f"<kern module {name}>", "exec"), mod.__dict__)  # noqa: S102 (pinned by sha256)
        self.modules[name] = mod

    def alloc(self, dtype: str, nelems: int, staged: bool = False) -> np.ndarray:
        """`staged` (an input buffer) changes nothing here: host memory is what kernels read."""
        return np.zeros(nelems, dtype=NP[dtype])

    def alloc_state(self, nbytes: int, chunk_bytes: int | None = None) -> np.ndarray:
        return np.zeros(nbytes, dtype=np.uint8)

    def remap(self, storage: np.ndarray, unmap: list[int], map: list[tuple[int, int]]) -> None:
        """Host memory is fully backed: a chunk's place needs no mapping."""

    def write(self, storage: np.ndarray, host: np.ndarray, offset: int = 0) -> None:
        flat = np.ascontiguousarray(host).reshape(-1)
        storage[offset:offset + flat.size] = flat

    def read(self, storage: np.ndarray, dtype: str, shape: tuple[int, ...], offset: int = 0) -> np.ndarray:
        n = int(np.prod(shape))
        return storage[offset:offset + n].reshape(shape).copy()

    def address(self, storage: np.ndarray) -> int:
        return int(storage.ctypes.data)

    def copy_bytes(self, storage: np.ndarray, dst: int, src: int, n: int) -> None:
        storage[dst:dst + n] = storage[src:src + n]

    def lower(self, launches: list[LoweredLaunch], buffers: dict[str, np.ndarray], states: dict[str, np.ndarray],
              graph: bool = False) -> "CpuProgram":
        return CpuProgram(self, launches, buffers, states)

    def synchronize(self) -> None:
        pass

    def memory(self) -> None:
        return None  # the host's memory: the engine keeps its default budget


class CpuProgram:
    """A lowered program on the cpu: each launch a function and argument getters."""

    runs_steps_natively = False  # run_steps loops single steps on the host

    def __init__(self, dev: CpuDevice, launches: list[LoweredLaunch], buffers, states) -> None:
        self.launches = launches
        views: dict[str, int] = {}
        uniq: list[View] = []
        self.steps: list[tuple[Callable, list]] = []
        for l in launches:
            if l.entry.startswith("extern:"):
                raise DeviceError(f"{l.where}: the cpu device has no extern {l.entry}")
            fn = getattr(dev.modules[l.module], l.entry, None)
            if not callable(fn):
                raise ModuleError(f"{l.where}: module {l.module!r} has no function {l.entry!r}")
            getters = []
            for a in l.args:
                if isinstance(a, View):
                    key = repr((a.buffer, a.offset, a.shape))
                    if key not in views:
                        views[key] = len(uniq)
                        uniq.append(a)
                    getters.append(("view", views[key]))
                elif isinstance(a, StateRef):
                    getters.append(("fixed", states[a.state]))
                else:
                    getters.append(("scalar", a))
            self.steps.append((fn, getters))
        self.views = uniq
        self.buffers = buffers
        self._bound: dict[tuple, list] = {}

    def resolve(self, env: dict[str, int]) -> list[np.ndarray]:
        out = []
        for v in self.views:
            shape = tuple(evaluate(d, env) for d in v.shape)
            off = evaluate(v.offset, env)
            out.append(self.buffers[v.buffer][off:off + prod(shape)].reshape(shape))
        return out

    def bind(self, env: dict[str, int]) -> list[tuple[Callable, list]]:
        """Every launch with its arguments resolved for this env (cached per shape bucket)."""
        key = tuple(sorted(env.items()))
        bound = self._bound.get(key)
        if bound is None:
            views = self.resolve(env)
            bound = [(fn, [views[x] if kind == "view" else x if kind == "fixed" else x.at(env)
                           for kind, x in getters]) for fn, getters in self.steps]
            if len(self._bound) >= 64:
                self._bound.clear()
            self._bound[key] = bound
        return bound

    def run(self, env: dict[str, int], wait: bool = True) -> None:  # the cpu always finishes
        for i, (fn, args) in enumerate(self.bind(env)):
            try:
                fn(*args)
            except Exception as exc:  # a kernel that fails on a verified manifest: say which launch
                l = self.launches[i]
                raise LaunchError(f"{l.where}: {l.module}.{l.entry} failed on the cpu device "
                                  f"({type(exc).__name__}: {exc})") from exc

    def run_steps(self, env: dict[str, int], later: list[list[np.ndarray]], varying: list[np.ndarray],
                  feedback: list[tuple[np.ndarray, np.ndarray, int]],
                  collect: list[tuple[np.ndarray, int]], each=None) -> list[list[np.ndarray]]:
        """The steps one after another, as Program.run_steps says (host memory is the device's)."""
        out = []
        for j in range(1 + len(later)):
            if j:
                for buf, arr in zip(varying, later[j - 1]):
                    buf[:arr.size] = arr.reshape(-1)
            self.run(env)
            for src, dst, n in feedback:
                dst.view(np.uint8)[:n] = src.view(np.uint8)[:n]
            out.append([c.view(np.uint8)[:n].copy() for c, n in collect])
            if each is not None:
                each(j, out[-1])
        return out
