"""Clocks, one per device kind. Timings never decide a result: they are what kern bench reports.

Each timer gives a scenario's per-call samples (`attribute`), one call alone (`call`, for
--isolate), a cache eviction and the device's copy ceiling.
cpu: calls run synchronously, so a clock around each of the program's own bound launches, in
a run of the program, is inside the real program; its base is what the run spends outside
them. Caches are evicted by touching a buffer twice the last-level cache; the ceiling is a
large memory copy.
cuda: the program cut after each call and each prefix timed whole with events around it
(prefix.py); one call alone between two events; caches evicted by a memset larger than L2;
the ceiling a large device-to-device copy.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from .prefix import Run, Samples, boundaries, by_prefix

EVICT_BYTES = 256 << 20  # cuda: more than any L2 (H200: 60 MB)
CEILING_BYTES = 64 << 20


def cpu_evict_bytes() -> int:
    """Twice the largest cache the OS reports (Linux sysfs), else 64 MiB."""
    sizes = []
    for f in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = f.read_text().strip()
        mult = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:], 1)
        digits = text.rstrip("KM")
        if digits.isdigit():
            sizes.append(int(digits) * mult)
    return 2 * max(sizes, default=32 << 20)


def stats(xs) -> dict[str, float]:
    a = np.asarray(xs, dtype=np.float64)
    return {"min": float(a.min()), "p10": float(np.percentile(a, 10)), "p50": float(np.percentile(a, 50)),
            "p90": float(np.percentile(a, 90)), "max": float(a.max())}


class CpuTimer:
    """A clock around each of the program's own bound launches (attribute); one call alone
    through its launches lowered on their own (kern.drive's EngineIO: isolate)."""

    kind = "cpu"

    def __init__(self, engine):
        from ..drive.engine_io import EngineIO

        self.engine = engine
        self.io = EngineIO(engine)
        self._evict: np.ndarray | None = None

    def device(self) -> dict:
        return {"kind": "cpu", "name": platform.processor() or platform.machine(), "driver": platform.platform()}

    def attribute(self, program: str, vars: dict[str, int], samples: int,
                  tick: Callable[[], None] = lambda: None) -> Samples:
        """A clock around each launch of the program's own bound launch list, run in order
        (what CpuProgram.run does, minus its error wrapping); the first sample warms."""
        prog = self.engine.programs[program]
        env = self.engine.env(program, vars)
        bound = prog.bind(env)
        owner = [l.call for l in self.engine.launches[program]]
        calls: list[list[float]] = [[] for _ in self.engine.m.programs[program].calls]
        base, steps = [], []
        for s in range(samples + 1):
            per = [0.0] * len(calls)
            t0 = time.perf_counter_ns()
            for (fn, args), c in zip(bound, owner):
                t = time.perf_counter_ns()
                fn(*args)
                per[c] += (time.perf_counter_ns() - t) / 1e3
            walk = (time.perf_counter_ns() - t0) / 1e3
            step = self.step(program, vars)
            if s == 0:
                continue
            for c, us in enumerate(per):
                calls[c].append(us)
            base.append(max(walk - sum(per), 0.0))
            steps.append(step)
            tick()
        return Samples(calls, base, steps, steps, "a clock around each launch of a run of the program")

    def call(self, program: str, ci: int, env: dict[str, int]) -> float:
        t0 = time.perf_counter_ns()
        self.io.run_calls(program, ci, ci + 1, env)
        return (time.perf_counter_ns() - t0) / 1e3

    def step(self, program: str, vars: dict[str, int]) -> float:
        t0 = time.perf_counter_ns()
        self.engine.run(program, vars)
        self.engine.device.synchronize()
        return (time.perf_counter_ns() - t0) / 1e3

    def evict(self) -> None:
        if self._evict is None:
            self._evict = np.zeros(cpu_evict_bytes() // 8)
        self._evict += 1.0  # reads and writes every line: what the call touches is gone

    def ceiling_gbps(self) -> float:
        a = np.ones(CEILING_BYTES // 4, np.float32)
        b = np.empty_like(a)
        best = min(_timed(lambda: np.copyto(b, a)) for _ in range(5))
        return 2 * a.nbytes / best / 1e9


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


class CudaTimer:  # exercised by tests/bench/test_bench_gpu.py on a GPU
    kind = "cuda"

    def __init__(self, engine):
        from ..runtime.devices.cuda.driver import call

        self.engine = engine
        self.drv = call
        self.stream = engine.device.stream
        self._evict = None

    def device(self) -> dict:
        v = self.drv("cuDriverGetVersion")
        return {"kind": "cuda", "name": self.engine.device.name, "driver": f"{v // 1000}.{v % 1000 // 10}"}

    def _events(self, n: int) -> list:
        return [self.drv("cuEventCreate", 0) for _ in range(n)]

    def _ms(self, a, b) -> float:
        return self.drv("cuEventElapsedTime", a, b)

    def attribute(self, program: str, vars: dict[str, int], samples: int,
                  tick: Callable[[], None] = lambda: None) -> Samples:
        """Each call's time inside the real program by prefixes (prefix.py): a graph program's
        prefixes are graphs of its first launches, captured as the program's own graph is (its
        input copies, then the launches); an eager program's are its first launches, run
        eagerly from an idle device as a step runs them."""
        from ..runtime.devices.cuda.graphs import capture

        prog = self.engine.programs[program]
        env = self.engine.run(program, vars)  # a graph program's own graph is captured by now
        items = prog.resolve(env)
        owner = [l.call for l in self.engine.launches[program]]
        ends = boundaries(owner, len(self.engine.m.programs[program].calls))
        s = self.stream
        graphs = []
        if prog.graph:
            own = prog._graphs[tuple(sorted(env.items()))]
            for m in ends:
                graphs.append(capture(s, lambda m=m: (prog._upload(env), prog._record(items[:m])),
                                      label=f"bench prefix of {m} launches"))
            prefixes: list[Run] = [lambda g=g: g.replay(s) for g in graphs]
            whole: Run = lambda: own.replay(s)  # noqa: E731
            method = "prefixes of the captured graph, each timed whole (events around its replay)"
        else:
            prefixes = [lambda m=m: (prog._upload(env), prog._record(items[:m])) for m in ends]
            whole = prefixes[-1]
            method = "prefixes of the eager launch list, each timed whole from an idle device"
        try:
            return by_prefix(_Events(self, paced=not prog.graph), prefixes, whole, samples,
                             lambda: self.step(program, vars), method, tick=tick)
        finally:
            for g in graphs:
                g.destroy()

    def step(self, program: str, vars: dict[str, int]) -> float:
        t0 = time.perf_counter_ns()
        self.engine.run(program, vars)
        self.engine.device.synchronize()
        return (time.perf_counter_ns() - t0) / 1e3

    def call(self, program: str, ci: int, env: dict[str, int]) -> float:
        """Events around one call's launches alone (the program's inputs uploaded first)."""
        prog = self.engine.programs[program]
        items = [it for it, l in zip(prog.resolve(env), self.engine.launches[program]) if l.call == ci]
        a, b = self._events(2)
        prog._upload(env)
        self.drv("cuEventRecord", a, self.stream.handle)
        prog._record(items)
        self.drv("cuEventRecord", b, self.stream.handle)
        self.stream.synchronize()
        us = self._ms(a, b) * 1e3
        for e in (a, b):
            self.drv("cuEventDestroy", e)
        return us

    def evict(self) -> None:
        from ..runtime.devices.cuda import memory

        if self._evict is None:
            self._evict = memory.alloc(EVICT_BYTES, "bench evict")
        memory.memset(self._evict.ptr, 1, EVICT_BYTES, self.stream)
        self.stream.synchronize()

    def ceiling_gbps(self) -> float:
        from ..runtime.devices.cuda import memory

        n = 8 * CEILING_BYTES
        src, dst = memory.alloc(n, "bench ceiling"), memory.alloc(n, "bench ceiling")
        a, b = self._events(2)
        best = float("inf")
        for _ in range(5):
            self.drv("cuEventRecord", a, self.stream.handle)
            memory.copy_device(dst.ptr, src.ptr, n, self.stream)
            self.drv("cuEventRecord", b, self.stream.handle)
            self.stream.synchronize()
            best = min(best, self._ms(a, b) / 1e3)
        for e in (a, b):
            self.drv("cuEventDestroy", e)
        src.free()
        dst.free()
        return 2 * n / best / 1e9


class _Events:
    """prefix.py's clock on CUDA: events around each timed run, everything enqueued before one
    wait. An eager (`paced`) run starts from an idle device (a wait before its first event), so
    the host's launch pace counts as it does in a step; a graph replay queues behind its warm
    run, as a step's replay queues behind the step before."""

    def __init__(self, timer: "CudaTimer", paced: bool):
        self.t, self.paced = timer, paced

    def elapsed(self, pairs: Sequence[tuple[Run, Run]]) -> list[float]:
        t, s = self.t, self.t.stream
        ev = t._events(2 * len(pairs))
        for i, (warm, run) in enumerate(pairs):
            warm()
            if self.paced:
                s.synchronize()
            t.drv("cuEventRecord", ev[2 * i], s.handle)
            run()
            t.drv("cuEventRecord", ev[2 * i + 1], s.handle)
        s.synchronize()
        out = [t._ms(ev[2 * i], ev[2 * i + 1]) * 1e3 for i in range(len(pairs))]
        for e in ev:
            t.drv("cuEventDestroy", e)
        return out


def timer_for(engine):
    return CudaTimer(engine) if engine.m.target.device == "cuda" else CpuTimer(engine)
