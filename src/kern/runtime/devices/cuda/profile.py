"""Device time of each launch of a cuda program, timed with events between its launches on the
program's stream (bench/profile_step.py, bench/kimi_gpu.py): where a step's time goes."""

from __future__ import annotations

from kern.runtime.devices.cuda.device import CudaProgram
from kern.runtime.devices.cuda.driver import call


def profile(program: CudaProgram, env: dict[str, int], repeats: int = 5) -> list[tuple[str, str, float]]:
    """Device time of every launch of a program, in microseconds (median of `repeats`), timed
    with events between launches on the program's stream: (where, entry, us) per launch."""
    items = program.resolve(env)
    s = program.dev.stream
    events = [call("cuEventCreate", 0) for _ in range(len(items) + 1)]
    times = [[] for _ in items]
    program._upload(env)
    for _ in range(repeats):
        call("cuEventRecord", events[0], s.handle)
        for i, it in enumerate(items):
            program._record([it])
            call("cuEventRecord", events[i + 1], s.handle)
        s.synchronize()
        for i in range(len(items)):
            times[i].append(call("cuEventElapsedTime", events[i], events[i + 1]) * 1e3)
    for e in events:
        call("cuEventDestroy", e)
    return [(l.where, l.entry, sorted(t)[len(t) // 2]) for l, t in zip(program.planned, times)]
