"""Checkpoints: a lease's units frozen in place under its tokens, parked in the host tier,
evicted, dropped.

A checkpoint lives on the device (`units`), in the host tier (`host`), or both; with neither
it leaves the index. Eviction takes device checkpoints with no device checkpoint below them
(leaves first): a shorter prefix leaves the device only after every longer one that extends
it, so nothing is stranded.
"""

from __future__ import annotations

from typing import Sequence

from kern.pool.admission import DeviceBooks
from kern.pool.errors import broken
from kern.pool.handles import Checkpoint, Lease
from kern.pool.host import HostTier
from kern.pool.index import PrefixIndex
from kern.pool.leases import Leases
from kern.pool.plans import EMPTY, MemoryPlan, ToHost
from kern.pool.results import Evict, NeverFits
from kern.pool.states import ceil_div


class Checkpoints:
    def __init__(self, device: DeviceBooks, host: HostTier, index: PrefixIndex, leases: Leases) -> None:
        self.device = device
        self.host = host
        self.index = index
        self.leases = leases
        self.layout = device.layout
        self.parked_tokens = 0  # tokens of checkpoints copied into the host tier

    def checkpoint(self, lease: Lease) -> Checkpoint | None:
        if lease.ahead:
            lease.ahead = 0
            self.leases.shrink(lease, ceil_div(len(lease.tokens), self.layout.page_tokens))
        self.device.unreserve(lease.reserved)
        tokens = tuple(lease.tokens)
        if not tokens:
            self._release(lease.units, -1)
            self.leases.end(lease)
            return None
        node = self.index.tree.insert(tokens)
        old = node.ckpt
        if old is not None and old.units is not None:  # these tokens are on the device already
            self._release(lease.units, -1)
            self.leases.end(lease)
            self.index.touch(node)
            return old
        for k, us in enumerate(lease.units):
            b = self.device.books[k]
            for u in us:
                b.adjust(u, 0, -1)
        units = tuple(tuple(us) for us in lease.units)
        self.leases.end(lease)
        if old is not None:  # a parked copy of the same tokens: it gets its device state back
            ckpt = old
            ckpt.units = units
        else:
            ckpt = self.index.file(tokens, units, node)
        self.index.device_changed(node, +1)
        self.index.touch(node)
        return ckpt

    def _release(self, units: Sequence[Sequence[int]], leases: int) -> None:
        for k, us in enumerate(units):
            for u in us:
                self.host.release(k, u, leases)

    # -- giving memory back ---------------------------------------------------------------
    def drop_device(self, ckpt: Checkpoint) -> None:
        if ckpt.units is None:
            raise broken(f"checkpoint {ckpt.id}", "dropped from the device while not on it")
        node = self.index.nodes[ckpt.id]
        self._release(ckpt.units, 0)
        ckpt.units = None
        self.index.device_changed(node, -1)
        self.index.push(node)
        if ckpt.host is None:
            self.index.forget(ckpt)

    def drop_host(self, ckpt: Checkpoint) -> None:
        if ckpt.host is None:
            raise broken(f"checkpoint {ckpt.id}", "dropped from the host tier while not in it")
        self.host.drop(ckpt.host)
        ckpt.host = None
        if ckpt.units is None:
            self.index.forget(ckpt)

    def drop(self, ckpt: Checkpoint) -> None:
        if ckpt.units is not None:
            self.drop_device(ckpt)
        if ckpt.host is not None:
            self.drop_host(ckpt)

    def park(self, ckpt: Checkpoint) -> MemoryPlan | Evict | NeverFits:
        if ckpt.units is None:
            return EMPTY
        if ckpt.host is not None:
            self.drop_device(ckpt)
            return EMPTY
        if not self.host.make_room(self.host.missing(ckpt.units)):
            hb = self.host.books
            whole = sum(ceil_div(len(us), hb[k].per_chunk) for k, us in enumerate(ckpt.units))
            if whole > self.layout.host_chunks:
                return NeverFits(whole, self.layout.host_chunks)
            return Evict(tuple((self.device.books[k].kind.name, len(us)) for k, us in enumerate(ckpt.units)))
        ckpt.host, copies = self.host.copy(ckpt.units)
        self.parked_tokens += len(ckpt.tokens)
        kinds = self.layout.kinds
        to_host = tuple(ToHost(kinds[k].name, u, self.layout.offset(kinds[k], h)) for k, u, h in copies)
        self.drop_device(ckpt)
        return MemoryPlan(to_host=to_host)

    def evict_one(self) -> MemoryPlan | None:
        ckpt = self.index.pop_device()
        if ckpt is None:
            return None
        if self.layout.host_chunks == 0:
            self.drop_device(ckpt)
            return EMPTY
        while True:
            r = self.park(ckpt)
            if isinstance(r, MemoryPlan):
                return r
            if isinstance(r, NeverFits) or not self._evict_host(keep=ckpt):
                self.drop_device(ckpt)
                return EMPTY

    def _evict_host(self, keep: Checkpoint) -> bool:
        """Drop the least recently used host copy (not keep's); False if there is none."""
        while True:
            c = self.index.pop_host()
            if c is None:
                return False
            if c is not keep:
                self.drop_host(c)
                return True

    def clear(self) -> None:
        for c in self.index.checkpoints():
            if c.alive:
                self.drop(c)
