"""Leases: starting one (fresh, from a checkpoint, or forked from a live lease), growing it as
tokens are written, and ending it.

A lease's pages past `len(tokens) // page_tokens` are its own and only it writes them; earlier
pages may be shared. Promised pages (`reserved`) are counted in every paged state's books, so
growth within the promise never waits. Pool vets the handles before it calls in here (advance
vets its own lists); nothing here changes the books before the last check has passed.
"""

from __future__ import annotations

from typing import Sequence

from kern.pool.admission import DeviceBooks
from kern.pool.errors import PoolError
from kern.pool.handles import Checkpoint, Lease
from kern.pool.host import HostTier
from kern.pool.index import PrefixIndex
from kern.pool.plans import Copy, FromHost, MemoryPlan
from kern.pool.results import Granted, Refusal, Remap
from kern.pool.states import ceil_div


class Leases:
    def __init__(self, device: DeviceBooks, host: HostTier, index: PrefixIndex) -> None:
        self.device = device
        self.host = host
        self.index = index
        self.pt = device.layout.page_tokens
        self.live: dict[int, Lease] = {}
        self.ids = 0
        self.woken_tokens = 0  # tokens leases started from host copies (woken, not recomputed)

    def check(self, lease: Lease, where: str) -> None:
        """PoolError unless `lease` is a live lease of this pool."""
        if not isinstance(lease, Lease) or not lease.alive or self.live.get(lease.id) is not lease:
            raise PoolError(f"{where}: {lease!r} is not a live lease of this pool")

    # -- starting ---------------------------------------------------------------------------
    def start(self, tokens: list[int], src: Checkpoint | Lease | None, reserve: int) -> Granted | Remap | Refusal:
        """A lease holding `tokens` (restored from `src`), promised `reserve` tokens in all."""
        pt, n = self.pt, len(tokens)
        device = src is not None and src.units is not None
        shared = n // pt if device else 0
        pages = ceil_div(reserve, pt) - shared
        r = self.device.admit(pages, 1, held=shared)
        if r is not None:
            return r
        copies: list[Copy] = []
        from_host: list[FromHost] = []
        units: list[list[int]] = []
        for b in self.device.books:
            k, name = b.kind.index, b.kind.name
            if src is None:
                mine = [] if b.kind.paged else [b.take()]
            elif device:
                have = src.units[k]  # type: ignore[index]
                if b.kind.paged:
                    mine = list(have[:shared])
                    for u in mine:
                        b.adjust(u, 1, 1)
                    if n % pt:
                        u = b.take()
                        copies.append(Copy(name, have[shared], u))
                        mine.append(u)
                else:
                    mine = [b.take()]
                    copies.append(Copy(name, have[0], mine[0]))
            else:  # wake from the host tier straight into the new lease
                host = src.host[k]  # type: ignore[union-attr]
                count = ceil_div(n, pt) if b.kind.paged else 1
                mine = [b.take() for _ in range(count)]
                for i, u in enumerate(mine):
                    h = host[i]
                    from_host.append(FromHost(name, self.device.layout.offset(b.kind, h), u))
                    if b.kind.paged and (i + 1) * pt <= n:  # whole pages stay identical to h
                        self.host.link(k, u, h)
            if not b.kind.paged:
                b.reserved -= 1
            units.append(mine)
        paged = self.device.paged
        bound = len(units[paged[0].kind.index]) - shared if paged else 0
        self.device.unreserve(bound)
        self.ids += 1
        lease = Lease(self.ids, tokens, units, pages - bound, self.device.kinds)
        self.live[lease.id] = lease
        if from_host:
            self.woken_tokens += n
        if isinstance(src, Checkpoint):
            self.index.touch(self.index.nodes[src.id])
        return Granted(lease, n, MemoryPlan(copies=tuple(copies), from_host=tuple(from_host)))

    # -- growing ----------------------------------------------------------------------------
    def extend(self, lease: Lease, tokens: Sequence[int], ahead: int) -> Remap | Refusal | None:
        pt = self.pt
        after = len(lease.tokens) + len(tokens) + ahead
        paged = self.device.paged
        if not paged:
            lease.tokens.extend(tokens)
            lease.ahead = ahead
            return None
        have = len(lease.units[paged[0].kind.index])
        new = ceil_div(after, pt) - have
        if new < 0:  # fewer tokens ahead than pages were bound for
            self.shrink(lease, have + new)
        if new > lease.reserved:
            r = self.device.admit(new - lease.reserved, 0, held=have + lease.reserved)
            if r is not None:
                return r
            lease.reserved = new
        for b in paged:
            pages = lease.units[b.kind.index]
            for _ in range(new):
                pages.append(b.take())
        if new > 0:
            self.device.unreserve(new)
            lease.reserved -= new
        lease.tokens.extend(tokens)
        lease.ahead = ahead
        return None

    def shrink(self, lease: Lease, keep: int) -> None:
        """Give back the lease's pages past the first `keep` (bound ahead for tokens a run wrote
        past the request's end); they return to its reservation."""
        extra = 0
        for b in self.device.paged:
            us = lease.units[b.kind.index]
            extra = len(us) - keep
            for u in reversed(us[keep:]):
                self.host.release(b.kind.index, u, -1)
            del us[keep:]
        if extra > 0:
            lease.reserved += extra
            for b in self.device.paged:
                b.reserved += extra

    def advance(self, leases: Sequence[Lease], tokens: Sequence[int]) -> list[tuple[Lease, Remap | Refusal]]:
        if len(leases) != len(tokens):
            raise PoolError(f"pool.advance: {len(leases)} leases and {len(tokens)} tokens; give one token per lease")
        self._distinct_live(leases)
        pt = self.pt
        paged = [(b, b.kind.index) for b in self.device.paged]
        stuck: list[tuple[Lease, Remap | Refusal]] = []
        for lease, t in zip(leases, tokens):
            toks = lease.tokens
            if lease.ahead:  # pages bound ahead: the general path keeps the count
                r = self.extend(lease, (t,), max(lease.ahead - 1, 0))
                if r is not None:
                    stuck.append((lease, r))
                continue
            if len(toks) % pt or not paged:
                toks.append(t)
                continue
            if lease.reserved == 0:
                r = self.extend(lease, (t,), 0)
                if r is not None:
                    stuck.append((lease, r))
                continue
            lease.reserved -= 1
            for b, k in paged:
                lease.units[k].append(b.take())
                b.reserved -= 1
            toks.append(t)
        return stuck

    def _distinct_live(self, leases: Sequence[Lease]) -> None:
        """PoolError unless `leases` are live leases of this pool, each listed once."""
        live = self.live
        for lease in leases:  # a step's hot path: the full check only for what fails this one
            if not isinstance(lease, Lease) or live.get(lease.id) is not lease:
                self.check(lease, "pool.advance")
        if len({x.id for x in leases}) < len(leases):  # live leases of this pool: an id is one lease
            twice = next(x for i, x in enumerate(leases) if x in leases[:i])
            raise PoolError(f"pool.advance: {twice!r} is listed twice; a step gives each lease one token")

    # -- ending -----------------------------------------------------------------------------
    def free(self, lease: Lease) -> None:
        for k, us in enumerate(lease.units):
            for u in us:
                self.host.release(k, u, -1)
        self.device.unreserve(lease.reserved)
        self.end(lease)

    def end(self, lease: Lease) -> None:
        """The lease is over; whoever holds its units now has been counted already."""
        lease.alive = False
        lease.reserved = 0
        del self.live[lease.id]
