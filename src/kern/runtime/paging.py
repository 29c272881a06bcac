"""The pool bound to an engine: the manifest's states become pool declarations, leases give
page tables, and the pool's plans run on the device's state memory.

The kernels address page p of a paged state at byte p * page_bytes, so chunks hold whole
pages: chunk_bytes is the smallest multiple of every unit size that is at least 2 MiB, or at
least 1/TARGET_CHUNKS of the budget (up to 64 MiB) where the budget is large: a device-sized
budget in 2 MiB chunks would be ~60,000 chunks to create at start-up and keep books on."""

from __future__ import annotations

import os
from math import lcm
from typing import Protocol

import numpy as np

from ..manifest.expr import evaluate
from ..manifest.verify import Verified
from ..pool import Evict, Granted, NeverFits, Pool, Remap, StateDecl, Wait
from ..pool.plans import MemoryPlan
from ..errors import KernError
from .device import Device
from .errors import DeviceError

MIN_CHUNK = 2 << 20
MAX_CHUNK = 64 << 20
TARGET_CHUNKS = 2048
HOST_SHARE = 4  # the host tier's default is at most a quarter of this machine's memory...
HOST_OVER_DEVICE = 2  # ...and twice the device's state budget: idle sessions outnumber running ones
DEFAULT_STATE_BUDGET = 512 << 20  # where the device shares the host's memory (cpu)
# Where the device has its own memory, the state budget defaults to this share of it, less what
# the weights and buffers took and GRAPH_RESERVE for the captured graphs and libraries that come
# after the pool (vLLM's default share is the same 90%).
DEVICE_SHARE = 0.9
GRAPH_RESERVE = 1 << 30


class States(Protocol):
    """What the pool's plans need of an engine: its state memory (Engine; RankedEngine, every rank's)."""

    def remap_state(self, state: str, unmap: list[int], map: list[tuple[int, int]]) -> None: ...

    def copy_state(self, state: str, dst: int, src: int, nbytes: int) -> None: ...

    def read_state(self, state: str, offset: int, nbytes: int) -> np.ndarray: ...

    def write_state(self, state: str, offset: int, data: np.ndarray) -> None: ...


class OutOfMemory(KernError):
    """The state budget cannot hold a request; says how much it needs and how much there is."""


class Busy(OutOfMemory):
    """The state budget cannot hold a request now: live requests hold the memory."""


def declarations(v: Verified, page_tokens: int, granularity: int = 1,
                 min_chunk: int = MIN_CHUNK) -> tuple[list[StateDecl], int]:
    """The pool's state declarations and a chunk size: a multiple of every page and slot size
    and of the device's mapping granularity, at least `min_chunk`."""
    decls, unit = [], granularity
    for name, st in v.manifest.states.items():
        if st.bytes_per_token is not None:
            size = evaluate(st.bytes_per_token, v.constants)
            decls.append(StateDecl(name, "paged", size))
            unit = lcm(unit, size * page_tokens)
        elif st.bytes_per_seq is not None:
            size = evaluate(st.bytes_per_seq, v.constants)
            decls.append(StateDecl(name, "per_seq", size))
            unit = lcm(unit, size)
        else:
            decls.append(StateDecl(name, "fixed", evaluate(st.bytes, v.constants)))
    return decls, unit * -(-min_chunk // unit)


def plan_pool(v: Verified, page_tokens: int, budget_bytes: int, granularity: int = 1, host_bytes: int = 0) -> Pool:
    """The pool for a manifest's states under a device budget (pure: nothing is allocated)."""
    decls, chunk = declarations(v, page_tokens, granularity,
                                min(MAX_CHUNK, max(MIN_CHUNK, budget_bytes // TARGET_CHUNKS)))
    budget = max(budget_bytes // chunk, 1) * chunk
    return Pool(budget, decls, page_tokens, chunk_bytes=chunk, host_bytes=host_bytes)


def state_sizes(pool: Pool) -> dict[str, int]:
    """Bytes of each state's memory: the virtual range of a paged or per-sequence state, the
    bytes of a fixed one."""
    lay = pool.layout
    return {**{k.name: lay.range_bytes(k) for k in lay.kinds}, **{f.name: f.bytes for f in lay.fixed}}


def host_budget(state_budget: int, asked: int | None) -> int:
    """Bytes of host memory idle sessions' checkpoints may park in: `asked`, else twice the
    state budget, at most a quarter of this machine's memory. The host tier is zero-filled
    memory the system commits only as pages are written, so an idle server costs nothing."""
    if asked is not None:
        return asked
    ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return min(HOST_OVER_DEVICE * state_budget, ram // HOST_SHARE)


class Paging:
    """Built by the engine once its states exist: runs the pool's initial plan at once."""

    def __init__(self, pool: Pool, engine: States):
        self.pool, self.engine = pool, engine
        lay = pool.layout
        self.kinds = {k.name: k for k in lay.kinds}
        self.page_tokens = lay.page_tokens
        paged = [k.name for k in lay.kinds if k.paged]
        # a lease holds as many pages of every paged state: the first one's count them all
        self.state = paged[0] if paged else None
        self._host = np.zeros(lay.host_chunks * lay.chunk_bytes, np.uint8)
        self.execute(pool.initial_plan)

    def execute(self, plan: MemoryPlan) -> None:
        """Run a plan on the engine's states, in the plan's order: unmap and map chunks in the
        states' virtual ranges (dynamic chunks are numbered from 0 for the device), then copy
        page bytes."""
        lay = self.pool.layout
        first = lay.first_dynamic
        # every state's unmaps before any map: the states share one set of physical chunks, and
        # a chunk moving from one state's range to another's must leave before it arrives
        for state in dict.fromkeys(u.state for u in plan.unmaps if u.state in self.kinds):
            self.engine.remap_state(state, unmap=[u.vchunk for u in plan.unmaps if u.state == state], map=[])
        for state in dict.fromkeys(m.state for m in plan.maps if m.state in self.kinds):  # fixed states: their own
            self.engine.remap_state(state, unmap=[], map=[(m.chunk - first, m.vchunk) for m in plan.maps
                                                          if m.state == state])
        for t in plan.to_host:
            k = self.kinds[t.state]
            self._host[t.host:t.host + k.unit_bytes] = self.engine.read_state(t.state, lay.offset(k, t.unit),
                                                                              k.unit_bytes)
        for c in plan.copies:
            k = self.kinds[c.state]
            self.engine.copy_state(c.state, lay.offset(k, c.dst), lay.offset(k, c.src), k.unit_bytes)
        for f in plan.from_host:
            k = self.kinds[f.state]
            self.engine.write_state(f.state, lay.offset(k, f.unit), self._host[f.host:f.host + k.unit_bytes])

    def capacity(self) -> int:
        """Tokens one sequence may hold with the whole budget to itself (its slots and the
        pages of every paged state)."""
        lo, hi = 0, self.pool.layout.dynamic * max(k.per_chunk for k in self.kinds.values()) * self.page_tokens
        while lo < hi:  # the largest count that fits (fits is monotonic)
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if self.fits(mid) else (lo, mid - 1)
        return lo

    def fits(self, reserve: int) -> bool:
        """Whether a lease of `reserve` tokens fits the budget with nothing else in it."""
        lay = self.pool.layout
        chunks = sum(-(-(-(-reserve // self.page_tokens) if k.paged else 1) // k.per_chunk) for k in lay.kinds)
        return chunks <= lay.dynamic

    def try_lease(self, prompt: list[int], reserve: int, cache: bool = True) -> Granted | None:
        """A lease for a request (all or nothing), evicting cached prefixes when asked to;
        None when live requests hold the memory (ask again after one ends)."""
        try:
            return self.lease(prompt, reserve, cache)
        except Busy:
            return None

    def lease(self, prompt: list[int], reserve: int, cache: bool = True):
        """A lease for a request (all or nothing), evicting cached prefixes when asked to."""
        while True:
            r = self.pool.lease(prompt, reserve, cache=cache)
            if isinstance(r, Granted):
                self.execute(r.plan)
                return r
            if isinstance(r, Remap):
                self.execute(r.plan)
                self.pool.remapped(r.plan)
            elif isinstance(r, Evict):
                plan = self.pool.evict_one()
                if plan is None:
                    raise Busy(f"the state budget cannot hold {reserve} tokens now: live requests hold it")
                self.execute(plan)
            elif isinstance(r, NeverFits):
                raise OutOfMemory(f"a request of {reserve} tokens needs {r.chunks_needed} chunks, the state "
                                  f"budget has {r.chunks_in_pool}: raise the budget or shorten the request")
            elif isinstance(r, Wait):
                raise Busy(f"the state budget cannot hold {reserve} tokens now: {r.why}")

    def snapshot(self, lease) -> bool:
        """A checkpoint of the lease's tokens so far while the lease runs on: whole pages shared,
        the page its tokens end inside and every slot copied (pool.fork, then checkpoint).
        False where the budget has no room for the copies now: a snapshot is worth neither an
        eviction nor a wait."""
        while True:
            r = self.pool.fork(lease, len(lease.tokens))
            if isinstance(r, Granted):
                self.execute(r.plan)
                self.pool.checkpoint(r.lease)
                return True
            if not isinstance(r, Remap):
                return False
            self.execute(r.plan)
            self.pool.remapped(r.plan)

    def extend(self, lease, tokens: list[int], ahead: int = 0) -> None:
        """Record `tokens` as written, and bind pages for `ahead` more (pool.extend)."""
        while True:
            r = self.pool.extend(lease, tokens, ahead)
            if r is None:
                return
            if isinstance(r, Remap):
                self.execute(r.plan)
                self.pool.remapped(r.plan)
                continue
            if isinstance(r, Evict) and (plan := self.pool.evict_one()) is not None:
                self.execute(plan)
                continue
            raise Busy(f"the state budget cannot grow a request past {len(lease.tokens)} tokens now")

    def try_grow(self, lease, tokens: int) -> bool:
        """Bind pages for `tokens` more tokens of the lease (past its promise the budget is
        asked again); False when live requests hold the memory."""
        try:
            self.extend(lease, [], ahead=tokens)
        except Busy:
            return False
        return True


def auto_budget(device: Device, asked: int | None) -> tuple[int, str]:
    """The state budget in bytes and a line saying where it came from: `asked`, else
    DEVICE_SHARE of the device's memory less what is in use (weights, buffers, other processes)
    and GRAPH_RESERVE; a device without memory of its own gets DEFAULT_STATE_BUDGET."""
    gib = lambda n: f"{n / 2**30:.1f} GiB"  # noqa: E731
    if asked is not None:
        return asked, f"state memory {gib(asked)} (asked)"
    mem = device.memory()
    if mem is None:
        return DEFAULT_STATE_BUDGET, f"state memory {DEFAULT_STATE_BUDGET >> 20} MiB (the default; --memory sets it)"
    free, total = mem
    used = total - free
    budget = int(DEVICE_SHARE * total) - used - GRAPH_RESERVE
    if budget < DEFAULT_STATE_BUDGET:
        raise DeviceError(f"the device has {gib(free)} free of {gib(total)}: too little for a state budget past "
                          f"{gib(used)} in use and {gib(GRAPH_RESERVE)} for graphs (--memory sets one)")
    return budget, (f"state memory {gib(budget)}: {DEVICE_SHARE:.0%} of the device's {gib(total)}, less "
                    f"{gib(used)} in use (weights, buffers) and {gib(GRAPH_RESERVE)} for graphs (--memory sets it)")
