"""Clocks, one per device kind. Timings never decide a result: they are what kern bench reports.

cpu: perf_counter around each call's lowered launches in a walk of the program, around a
whole step, and around one call alone; caches are evicted by touching a buffer twice the
last-level cache; the ceiling is a large memory copy.
cuda: events between launches in an eager walk of the program (contiguous, so their sum is
the walk), host time around a whole step (a graph replay where the program is captured),
events around one call's launches; caches are evicted by a memset larger than L2; the
ceiling is a large device-to-device copy."""

from __future__ import annotations

import platform
import time
from pathlib import Path

import numpy as np

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
    """Each call's launches lowered on their own (the harness's EngineIO) and timed in program
    order: the walk runs exactly the program's launches, a clock around each call."""

    kind = "cpu"

    def __init__(self, engine):
        from ..harness.engine_io import EngineIO

        self.engine = engine
        self.io = EngineIO(engine)
        self._evict: np.ndarray | None = None

    def device(self) -> dict:
        return {"kind": "cpu", "name": platform.processor() or platform.machine(), "driver": platform.platform()}

    def walk(self, program: str, vars: dict[str, int]) -> tuple[list[float], float]:
        """(us of each call, us of the whole walk) for one run of the program, call by call."""
        env = self.engine.env(program, vars)
        out = []
        t0 = time.perf_counter_ns()
        for ci in range(len(self.engine.m.programs[program].calls)):
            out.append(self.call(program, ci, env))
        return out, (time.perf_counter_ns() - t0) / 1e3

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


class CudaTimer:  # exercised by tests/bench_cmd/test_bench_gpu.py on a GPU
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

    def walk(self, program: str, vars: dict[str, int]) -> tuple[list[float], float]:
        """(us of each call, us of the whole walk): events between the launches of an eager
        walk of the lowered program; a call's time is its launches'."""
        prog = self.engine.programs[program]
        env = self.engine.env(program, vars)
        items = prog.resolve(env)
        ev = self._events(len(items) + 1)
        prog._upload(env)
        self.drv("cuEventRecord", ev[0], self.stream.handle)
        for i, it in enumerate(items):
            prog._record([it])
            self.drv("cuEventRecord", ev[i + 1], self.stream.handle)
        self.stream.synchronize()
        per_call = [0.0] * len(self.engine.m.programs[program].calls)
        for i, l in enumerate(self.engine.launches[program]):
            per_call[l.call] += self._ms(ev[i], ev[i + 1]) * 1e3
        total = self._ms(ev[0], ev[-1]) * 1e3
        for e in ev:
            self.drv("cuEventDestroy", e)
        return per_call, total

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


def timer_for(engine):
    return CudaTimer(engine) if engine.m.target.device == "cuda" else CpuTimer(engine)
