"""Admission and remap: the device's books (one `Books` per paged or per-sequence state over
the dynamic chunks), which state each dynamic chunk is mapped to, and the decision whether a
request for units fits now, after a remap, or not at all.

A chunk moves between states only through a remap plan: the books map it at once but keep
its units out of reach (`pending`) until the runtime says the plan ran (`remapped`), so no
unit is handed out over memory that is not mapped yet. While one is in flight, requests that
run short wait (budget.decide), which keeps remaps one at a time.
"""

from __future__ import annotations

from typing import Mapping

from kern.pool import budget
from kern.pool.errors import PoolError, broken
from kern.pool.plans import Map, MemoryPlan, Unmap
from kern.pool.results import Refusal, Remap
from kern.pool.states import Layout, LayoutError
from kern.pool.units import Books


class DeviceBooks:
    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.kinds = {k.name: k for k in layout.kinds}  # paged and per-sequence states by name
        self.books = [Books(k, layout.dynamic) for k in layout.kinds]
        self.paged = tuple(b for b in self.books if b.kind.paged)
        self.owner: dict[int, tuple[int, int]] = {}  # dynamic chunk -> (kind, place)
        self.unmapped: list[int] = []  # dynamic chunks with nothing mapped
        self.in_flight = 0  # places mapped in the books, awaiting `remapped`

    def initial(self, split: Mapping[str, int] | None) -> MemoryPlan:
        """Map the fixed states' chunks for good and the dynamic chunks as `split` says
        (default: one per per-sequence state, the rest shared evenly by the paged states)."""
        L = self.layout
        maps = [Map(f.first_chunk + i, f.name, i) for f in L.fixed for i in range(f.chunks)]
        n = L.dynamic
        if split is None:
            counts = [0 if b.kind.paged else 1 for b in self.books]
            paged = [i for i, b in enumerate(self.books) if b.kind.paged] or list(range(len(counts)))
            rest = n - sum(counts)
            for j, i in enumerate(paged):
                counts[i] += rest // len(paged) + (j < rest % len(paged))
        else:
            unknown = [s for s in split if s not in self.kinds]
            if unknown:
                raise LayoutError(f"pool: split names no paged or per-sequence state: {unknown}")
            counts = [split.get(b.kind.name, 0) for b in self.books]
            if sum(counts) > n or min(counts, default=0) < 0:
                raise LayoutError(f"pool: split {dict(split)} needs {sum(counts)} chunks, {n} are dynamic")
        chunk = L.first_dynamic
        for b, c in zip(self.books, counts):
            for place in range(c):
                b.map(place, chunk, ready=True)
                self.owner[chunk] = (b.kind.index, place)
                maps.append(Map(chunk, b.kind.name, place))
                chunk += 1
        self.unmapped = list(range(chunk, L.chunks))
        return MemoryPlan(maps=tuple(maps))

    def admit(self, pages: int, slots: int, held: int = 0) -> Remap | Refusal | None:
        """Promise `pages` pages of every paged state and `slots` slots of every per-sequence
        state (None), or say what must happen first. `held`: pages the requester holds already
        (they count toward never-fits)."""
        if all(b.avail >= (pages if b.kind.paged else slots) for b in self.books):
            for b in self.books:
                b.reserved += pages if b.kind.paged else slots
            return None
        views = tuple(
            budget.KindView(
                b.kind.name,
                pages if b.kind.paged else slots,
                held if b.kind.paged else 0,
                b.avail,
                b.per_chunk,
                tuple(b.empty_places()),
                tuple(p for p, c in enumerate(b.vmap) if c < 0),
                b.cached,
                sum(1 for c in b.vmap if c >= 0),
            )
            for b in self.books
        )
        d = budget.decide(views, tuple(sorted(self.unmapped)), self.layout.dynamic, self.in_flight > 0)
        if d is None:
            raise broken("pool budget", "saw no shortage where the books saw one")
        if isinstance(d, Refusal):
            return d
        unmaps, maps = [], []
        gone: dict[int, list[int]] = {}
        for m in d:
            if m.src is None:
                self.unmapped.remove(m.chunk)
            else:
                k, place = m.src
                gone.setdefault(k, []).append(place)
                unmaps.append(Unmap(m.chunk, self.books[k].kind.name, place))
            k, place = m.dst
            self.books[k].map(place, m.chunk, ready=False)
            self.owner[m.chunk] = (k, place)
            self.in_flight += 1
            maps.append(Map(m.chunk, self.books[k].kind.name, place))
        for k in sorted(gone):
            self.books[k].unmap(gone[k])
        return Remap(MemoryPlan(unmaps=tuple(unmaps), maps=tuple(maps)))

    def remapped(self, plan: MemoryPlan) -> None:
        """The runtime ran `plan`: its chunks' units may be handed out. Every map is checked
        before any is opened, so a plan this pool is not waiting for changes nothing."""
        if not isinstance(plan, MemoryPlan):
            raise PoolError(f"pool.remapped: {plan!r} is not a plan")
        places: list[tuple[int, int]] = []
        for m in plan.maps:
            place = self._awaiting(m)
            if place is None or place in places:
                raise PoolError(f"pool.remapped: {m} is not a remap in flight")
            places.append(place)
        for k, vchunk in places:
            self.books[k].open(vchunk)
            self.in_flight -= 1

    def _awaiting(self, m: Map) -> tuple[int, int] | None:
        """(kind, place) when `m` is a map the books made and the runtime has not confirmed."""
        kind = self.kinds.get(m.state)
        if kind is None:
            return None
        b = self.books[kind.index]
        if 0 <= m.vchunk < len(b.vmap) and b.vmap[m.vchunk] == m.chunk and b.pending[m.vchunk]:
            return kind.index, m.vchunk
        return None

    def unreserve(self, pages: int) -> None:
        """Withdraw a promise of `pages` pages of every paged state."""
        for b in self.paged:
            b.reserved -= pages
