"""The host tier's books: host units per state (a host chunk holds units of one state, and
moves between states when it is empty), and links from device units to identical host units.

A link says device unit u holds the same bytes as host unit h (u was parked into h, or woken
whole from it), so parking u again copies nothing. A link lives while both ends are held:
a device unit that goes free, or a host unit that goes free, takes its links with it.
"""

from __future__ import annotations

from kern.pool.admission import DeviceBooks
from kern.pool.states import Layout, ceil_div
from kern.pool.units import Books


class HostTier:
    def __init__(self, layout: Layout, device: DeviceBooks) -> None:
        self.layout = layout
        self.device = device
        self.books = [Books(k, layout.host_chunks) for k in layout.kinds]  # host place = host chunk
        self.owner = [-1] * layout.host_chunks  # host chunk -> kind, -1 while never used
        self.dev_host: list[dict[int, int]] = [{} for _ in layout.kinds]  # device unit -> identical host unit
        self.host_dev: list[dict[int, list[int]]] = [{} for _ in layout.kinds]  # and back

    def release(self, k: int, u: int, leases: int) -> None:
        """Device unit u of kind k loses a holder (`leases`: -1 when it was a lease, else 0)."""
        if self.device.books[k].adjust(u, -1, leases):
            h = self.dev_host[k].pop(u, None)
            if h is not None:
                self.host_dev[k][h].remove(u)
                if not self.host_dev[k][h]:
                    del self.host_dev[k][h]

    def link(self, k: int, u: int, h: int) -> None:
        self.dev_host[k][u] = h
        self.host_dev[k].setdefault(h, []).append(u)

    def missing(self, units: tuple[tuple[int, ...], ...]) -> list[int]:
        """Per kind, how many of these device units have no host copy yet."""
        return [sum(1 for u in us if u not in self.dev_host[k]) for k, us in enumerate(units)]

    def make_room(self, missing: list[int]) -> bool:
        """Give each kind enough free host units for `missing` more, moving host chunks to it
        (never-used ones first, then empty ones of kinds with units to spare); all or nothing."""
        chunks = [ceil_div(max(0, m - hb.nfree), hb.per_chunk) for m, hb in zip(missing, self.books)]
        if not any(chunks):
            return True
        src: list[tuple[int, int]] = [(-1, c) for c, o in enumerate(self.owner) if o < 0]
        for j, hb in enumerate(self.books):
            if chunks[j]:
                continue
            spare = hb.nfree - missing[j]
            for place, _ in hb.empty_places():
                if spare < hb.per_chunk:
                    break
                src.append((j, place))
                spare -= hb.per_chunk
        if sum(chunks) > len(src):
            return False
        i = 0
        for k, n in enumerate(chunks):
            for _ in range(n):
                j, chunk = src[i]
                i += 1
                if j >= 0:
                    self.books[j].unmap([chunk])
                self.books[k].map(chunk, chunk, ready=True)
                self.owner[chunk] = k
        return True

    def copy(self, units: tuple[tuple[int, ...], ...]) -> tuple[tuple[tuple[int, ...], ...], list[tuple[int, int, int]]]:
        """Host units holding these device units (room made already): a linked host unit gains
        a holder, any other device unit gets a new host unit. Returns the host units per kind
        and the (kind, device unit, host unit) copies to run."""
        host: list[tuple[int, ...]] = []
        copies: list[tuple[int, int, int]] = []
        for k, us in enumerate(units):
            hb = self.books[k]
            mine = []
            for u in us:
                h = self.dev_host[k].get(u)
                if h is None:
                    h = hb.take(lease=False)
                    self.link(k, u, h)
                    copies.append((k, u, h))
                else:
                    hb.adjust(h, 1, 0)
                mine.append(h)
            host.append(tuple(mine))
        return tuple(host), copies

    def drop(self, host: tuple[tuple[int, ...], ...]) -> None:
        """A checkpoint lets go of its host units; the ones that go free lose their links."""
        for k, hs in enumerate(host):
            for h in hs:
                if self.books[k].adjust(h, -1, 0):
                    for u in self.host_dev[k].pop(h, ()):
                        del self.dev_host[k][u]
