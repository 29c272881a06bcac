"""Books of one kind of unit (the pages of one paged state, or the slots of one per-sequence
state) over a range of chunk places: which units are free, who holds the rest.

Holders are counted per unit: `refs` counts every holder (leases and checkpoints), `lrefs`
the leases among them. `cached` counts units held by checkpoints only (what eviction could
give back), each shared unit once. Units are handed out lowest first, so high chunk places
drain empty, ready to be remapped. The free units are kept a place at a time (a min-heap of a
place's free units, and a min-heap of the places that have some): the lowest free unit is the
lowest of the lowest such place, and unmapping a place drops its free units without a walk of
every other place's (a device-sized budget has ~400,000 pages: a remap that rebuilt one heap
of them all cost ~30 ms of the host, and a hybrid model remaps as its slots grow).
"""

from __future__ import annotations

from heapq import heappop, heappush

from kern.pool.errors import broken
from kern.pool.states import UnitKind


class Books:
    __slots__ = ("kind", "per_chunk", "free_at", "places", "nfree", "refs", "lrefs", "vmap", "used", "pending",
                 "reserved", "cached", "opened")

    def __init__(self, kind: UnitKind, places: int) -> None:
        self.kind = kind
        self.per_chunk = kind.per_chunk
        n = places * kind.per_chunk
        self.free_at: list[list[int]] = [[] for _ in range(places)]  # place -> heap of its free units
        self.places: list[int] = []  # heap of places with free units (a place emptied by unmap may linger: skipped)
        self.nfree = 0
        self.refs = [0] * n
        self.lrefs = [0] * n
        self.vmap = [-1] * places  # place -> physical chunk, -1 when nothing is mapped there
        self.used = [0] * places  # units of each place that are not free
        self.pending = [False] * places  # mapped in the books, not yet done by the runtime
        self.reserved = 0  # units promised to leases, not yet handed out
        self.cached = 0
        self.opened = 0  # places mapped and not pending: kept so usage() costs no walk of vmap

    # -- chunk places ------------------------------------------------------------------
    def map(self, place: int, chunk: int, ready: bool) -> None:
        if self.vmap[place] != -1:
            raise broken(f"{self.kind.name} place {place}", f"mapped over chunk {self.vmap[place]}")
        self.vmap[place] = chunk
        if ready:
            self.open(place)
        else:
            self.pending[place] = True

    def open(self, place: int) -> None:
        self.pending[place] = False
        self.opened += 1
        pc = self.per_chunk
        if not self.free_at[place]:
            heappush(self.places, place)
        self.free_at[place] = list(range(place * pc, place * pc + pc))  # ascending: a heap already
        self.nfree += pc

    def unmap(self, places: list[int]) -> None:
        for p in places:
            if self.used[p] or self.pending[p]:
                raise broken(f"{self.kind.name} place {p}", "unmapped while in use or awaiting a remap")
        for p in places:
            self.nfree -= len(self.free_at[p])
            self.free_at[p] = []
            self.opened -= self.vmap[p] >= 0
            self.vmap[p] = -1

    def empty_places(self) -> list[tuple[int, int]]:
        """(place, chunk) of mapped places with every unit free, highest place first."""
        return [
            (p, self.vmap[p])
            for p in range(len(self.vmap) - 1, -1, -1)
            if self.vmap[p] >= 0 and self.used[p] == 0 and not self.pending[p]
        ]

    @property
    def free(self) -> list[int]:
        """Every free unit (a walk: for checks, not for the hot path, which counts `nfree`)."""
        return [u for heap in self.free_at for u in heap]

    @property
    def avail(self) -> int:
        return self.nfree - self.reserved

    def _push(self, u: int) -> None:
        place = u // self.per_chunk
        heap = self.free_at[place]
        if not heap:
            heappush(self.places, place)
        heappush(heap, u)
        self.nfree += 1

    # -- units -------------------------------------------------------------------------
    def take(self, lease: bool = True) -> int:
        """Hand out the lowest free unit to one holder (a lease, or a host-side checkpoint)."""
        places = self.places
        while not self.free_at[places[0]]:  # places an unmap emptied
            heappop(places)
        heap = self.free_at[places[0]]
        u = heappop(heap)
        if not heap:
            heappop(places)
        self.nfree -= 1
        self.used[u // self.per_chunk] += 1
        self.refs[u] = 1
        if lease:
            self.lrefs[u] = 1
        else:
            self.cached += 1
        return u

    def adjust(self, u: int, dr: int, dl: int) -> bool:
        """Add dr holders, dl of them leases; True when the unit became free."""
        r0, l0 = self.refs[u], self.lrefs[u]
        r1, l1 = r0 + dr, l0 + dl
        if not 0 <= l1 <= r1:
            raise broken(f"{self.kind.name} unit {u}", f"would count {r1} holders, {l1} of them leases")
        self.refs[u] = r1
        self.lrefs[u] = l1
        self.cached += (r1 > 0 and l1 == 0) - (r0 > 0 and l0 == 0)
        if r1 == 0:
            self.used[u // self.per_chunk] -= 1
            self._push(u)
            return True
        return False
