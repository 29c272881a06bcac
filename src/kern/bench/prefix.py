"""Time attributed to every call inside the program as it really runs, by prefixes.

A clock between calls changes what it measures: an event between two launches breaks the
programmatic dependent launch (PDL) that lets a kernel start while the one before it drains,
and an eager walk pays a launch gap per kernel (several times the graph step: docs/perf.md). So
nothing is put between calls. Instead the program is cut after
each call: prefix k is the program's first k calls, run exactly as the program runs them (a
graph of those launches, captured the same way, or the same eager launches), and timed
whole. T(k) is when the program's first k calls are done; call k's time is T(k + 1) - T(k),
its price on the critical path of the real program, PDL overlap included. T(0) (the input
copies and the start of a run) is the step's base.

Each timed prefix follows an untimed run of the whole program, so caches hold what a real
step finds (the end of the step before, not the prefix's own weights). The prefixes of a
sample run in a seeded shuffled order, so a slow drift of the clock spreads over every call
instead of tilting the early ones against the late ones, and an independent run of the
whole program (the untraced step) is timed among them. By construction the calls' times sum
to T(n) - T(0): the check of their sum against the untraced step measures the noise and the
base, and would catch a prefix run that is not the program."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

Run = Callable[[], None]


class Clock(Protocol):
    def elapsed(self, pairs: Sequence[tuple[Run, Run]]) -> list[float]:
        """For each (warm, run) in order: warm() untimed, then run() timed; microseconds each."""


@dataclass(frozen=True, slots=True)
class Samples:
    """Per-sample timings of one scenario, in microseconds."""

    calls: list[list[float]]  # per call, one time per sample
    base: list[float]  # the step's time outside every call
    step: list[float]  # the whole untraced step, timed on its own
    host: list[float]  # host time around one run of the step (inputs, launch, the wait)
    method: str


def boundaries(owner: Sequence[int], calls: int) -> list[int]:
    """Launches before each call boundary: entry k is how many launches the first k calls make
    (`owner[i]` is the call launch i belongs to; a call's launches are contiguous)."""
    return [sum(1 for c in owner if c < k) for k in range(calls + 1)]


def by_prefix(clock: Clock, prefixes: Sequence[Run], whole: Run, samples: int, host: Callable[[], float],
              method: str, seed: int = 0, tick: Callable[[], None] = lambda: None) -> Samples:
    """`prefixes[k]` runs the program's first k calls (the last one: all of them); `whole` is
    the program as the engine runs it. The first sample only warms the clocks and is dropped."""
    n = len(prefixes) - 1
    rng = np.random.Generator(np.random.PCG64(seed))
    calls: list[list[float]] = [[] for _ in range(n)]
    base, step, hosts = [], [], []
    for s in range(samples + 1):
        order = [int(k) for k in rng.permutation(n + 2)]  # k = n + 1: the untraced step
        t = clock.elapsed([(whole, prefixes[k] if k <= n else whole) for k in order])
        at = dict(zip(order, t))
        h = host()
        if s == 0:
            continue
        for c in range(n):
            calls[c].append(at[c + 1] - at[c])
        base.append(at[0])
        step.append(at[n + 1])
        hosts.append(h)
        tick()
    return Samples(calls, base, step, hosts, method)
