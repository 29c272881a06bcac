"""A stand-in for the device that runs the pool's plans: numpy uint8 arrays, one per state laid
out as `Layout.offset` says, plus one host array. Memory whose chunk leaves (or arrives) is
poisoned, so a wrong remap reads back as bad bytes instead of yesterday's right ones."""

from __future__ import annotations

import numpy as np

from kern.pool.plans import MemoryPlan
from kern.pool.states import Layout

POISON = 0xA5


class ExecutorError(RuntimeError):
    """The plan touched memory that is not mapped, or mapped a place twice."""


class CpuExecutor:
    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.states: dict[str, np.ndarray] = {}
        for f in layout.fixed:
            self.states[f.name] = np.full(f.chunks * layout.chunk_bytes, POISON, np.uint8)
        for k in layout.kinds:
            self.states[k.name] = np.full(layout.range_bytes(k), POISON, np.uint8)
        self.host = np.full(layout.host_chunks * layout.chunk_bytes, POISON, np.uint8)
        self.mapped: dict[tuple[str, int], int] = {}  # (state, place) -> physical chunk
        self._kinds = {k.name: k for k in layout.kinds}

    def unit(self, state: str, u: int) -> np.ndarray:
        """A writable view of one page or slot (its chunk must be mapped)."""
        k = self._kinds[state]
        place = u // k.per_chunk
        if (state, place) not in self.mapped:
            raise ExecutorError(f"cpu executor: {state} unit {u} lies in place {place}, which has no chunk mapped")
        at = self.layout.offset(k, u)
        return self.states[state][at : at + k.unit_bytes]

    def host_range(self, state: str, at: int) -> np.ndarray:
        return self.host[at : at + self._kinds[state].unit_bytes]

    def execute(self, plan: MemoryPlan) -> None:
        """Run `plan`: unmaps, maps, to_host, copies, from_host, in that order."""
        cb = self.layout.chunk_bytes
        for m in plan.unmaps:
            if self.mapped.get((m.state, m.vchunk)) != m.chunk:
                raise ExecutorError(f"cpu executor: {m}: that chunk is not mapped there")
            del self.mapped[(m.state, m.vchunk)]
            self.states[m.state][m.vchunk * cb : (m.vchunk + 1) * cb] = POISON
        for m in plan.maps:
            if (m.state, m.vchunk) in self.mapped or m.chunk in self.mapped.values():
                raise ExecutorError(f"cpu executor: {m}: place or chunk already mapped")
            self.mapped[(m.state, m.vchunk)] = m.chunk
            self.states[m.state][m.vchunk * cb : (m.vchunk + 1) * cb] = POISON
        for t in plan.to_host:
            self.host_range(t.state, t.host)[:] = self.unit(t.state, t.unit)
        for c in plan.copies:
            self.unit(c.state, c.dst)[:] = self.unit(c.state, c.src)
        for f in plan.from_host:
            self.unit(f.state, f.unit)[:] = self.host_range(f.state, f.host)
