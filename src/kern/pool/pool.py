"""The pool: one budget of physical chunks for every paged and per-sequence state, leases,
checkpoints in a prefix tree, and a host tier. It decides and keeps books; plans say what
the runtime must do to memory. No clock, no randomness: LRU runs on a tick counter, every
choice takes the lowest index or the first in insertion order.
"""

from __future__ import annotations

from heapq import heappop, heappush
from typing import Mapping, Sequence

from kern.pool import budget
from kern.pool.lease import Checkpoint, Lease
from kern.pool.plans import EMPTY, Copy, FromHost, Map, Plan, ToHost, Unmap
from kern.pool.radix import Node, RadixTree
from kern.pool.results import Evict, Granted, Match, NeverFits, Refusal, Remap, Wait
from kern.pool.states import Layout, LayoutError, StateDecl, plan_layout
from kern.pool.units import Books

NO_MATCH = Match(0, None)


class PoolError(RuntimeError):
    """A caller broke the pool's contract (a dead lease, an unknown plan); names the object."""


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


class Pool:
    def __init__(
        self,
        budget_bytes: int,
        states: Sequence[StateDecl],
        page_tokens: int,
        *,
        chunk_bytes: int = 2 << 20,
        host_bytes: int = 0,
        split: Mapping[str, int] | None = None,
    ) -> None:
        """`split`: chunks to map to each paged or per-sequence state at start (the rest stay
        unmapped until needed). Default: one chunk per per-sequence state, the rest shared
        evenly by the paged states. The split only sets where things start; remaps move
        chunks as the load asks."""
        self.layout: Layout = plan_layout(budget_bytes, states, page_tokens, chunk_bytes, host_bytes)
        L = self.layout
        self._pt = page_tokens
        self._index = {k.name: k.index for k in L.kinds}
        self._books = [Books(k, L.dynamic) for k in L.kinds]
        self._paged = tuple(b for b in self._books if b.kind.paged)
        self._host = [Books(k, L.host_chunks) for k in L.kinds]  # host place = host chunk
        self._host_owner = [-1] * L.host_chunks
        self._dev_host: list[dict[int, int]] = [{} for _ in L.kinds]  # device unit -> identical host unit
        self._host_dev: list[dict[int, list[int]]] = [{} for _ in L.kinds]
        self._owner: dict[int, tuple[int, int]] = {}  # dynamic chunk -> (kind, place)
        self._unmapped: list[int] = []  # heap of dynamic chunks with nothing mapped
        self._in_flight = 0  # places mapped in the books, awaiting pool.remapped
        self._leases: dict[int, Lease] = {}
        self._tree = RadixTree()
        self._tick = 0
        self._ids = 0
        self._dev_heap: list[tuple[int, int, Node]] = []  # device eviction candidates (lazy)
        self._host_heap: list[tuple[int, int, Node]] = []  # host eviction candidates (lazy)
        self.initial_plan = self._initial(split)

    # ------------------------------------------------------------------ set-up
    def _initial(self, split: Mapping[str, int] | None) -> Plan:
        L = self.layout
        maps = [Map(f.first_chunk + i, f.name, i) for f in L.fixed for i in range(f.chunks)]
        n = L.dynamic
        if split is None:
            counts = [0 if b.kind.paged else 1 for b in self._books]
            paged = [i for i, b in enumerate(self._books) if b.kind.paged] or list(range(len(counts)))
            rest = n - sum(counts)
            for j, i in enumerate(paged):
                counts[i] += rest // len(paged) + (j < rest % len(paged))
        else:
            unknown = [s for s in split if s not in self._index]
            if unknown:
                raise LayoutError(f"pool: split names no paged or per-sequence state: {unknown}")
            counts = [split.get(b.kind.name, 0) for b in self._books]
            if sum(counts) > n or min(counts, default=0) < 0:
                raise LayoutError(f"pool: split {dict(split)} needs {sum(counts)} chunks, {n} are dynamic")
        chunk = L.first_dynamic
        for b, c in zip(self._books, counts):
            for place in range(c):
                b.map(place, chunk, ready=True)
                self._owner[chunk] = (b.kind.index, place)
                maps.append(Map(chunk, b.kind.name, place))
                chunk += 1
        self._unmapped = list(range(chunk, L.chunks))
        return Plan(maps=tuple(maps))

    # ------------------------------------------------------------------ budget
    def _admit(self, pages: int, slots: int, held: int = 0) -> Remap | Refusal | None:
        """Promise `pages` pages of every paged state and `slots` slots of every per-sequence
        state, or say why not. `held`: pages the requester holds already."""
        ok = True
        for b in self._books:
            if b.avail < (pages if b.kind.paged else slots):
                ok = False
                break
        if ok:
            for b in self._books:
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
            )
            for b in self._books
        )
        d = budget.decide(views, tuple(sorted(self._unmapped)), self.layout.dynamic, self._in_flight > 0)
        if d is None:  # cannot happen: the fast path saw a shortage
            raise AssertionError("pool: budget saw no shortage the fast path saw")
        if isinstance(d, Refusal):
            return d
        unmaps, maps = [], []
        gone: dict[int, list[int]] = {}
        for m in d:
            if m.src is None:
                self._unmapped.remove(m.chunk)
            else:
                k, place = m.src
                gone.setdefault(k, []).append(place)
                unmaps.append(Unmap(m.chunk, self._books[k].kind.name, place))
            k, place = m.dst
            self._books[k].map(place, m.chunk, ready=False)
            self._owner[m.chunk] = (k, place)
            self._in_flight += 1
            maps.append(Map(m.chunk, self._books[k].kind.name, place))
        for k in sorted(gone):
            self._books[k].unmap(gone[k])
        return Remap(Plan(unmaps=tuple(unmaps), maps=tuple(maps)))

    def remapped(self, plan: Plan) -> None:
        """The runtime has run a remap plan: its chunks' units are free to hand out."""
        for m in plan.maps:
            b = self._books[self._index[m.state]]
            if not (b.vmap[m.vchunk] == m.chunk and b.pending[m.vchunk]):
                raise PoolError(f"pool.remapped: {m} is not a remap in flight")
            b.open(m.vchunk)
            self._in_flight -= 1

    def _unreserve(self, pages: int) -> None:
        for b in self._paged:
            b.reserved -= pages

    # ------------------------------------------------------------------ prefix lookup
    def match(self, prompt: Sequence[int]) -> Match:
        """The longest cached prefix of `prompt[:-1]` usable to start a lease (pure).

        With only paged states any prefix works (the page it ends inside gets copied); with a
        per-sequence state too, only a whole checkpoint does (its state holds all its tokens)."""
        q = tuple(prompt[:-1])
        node, inside, pos = self._tree.walk(q)
        if len(self._paged) < len(self._books):  # per-sequence states: whole checkpoints only
            n: Node | None = node
            while n is not None and n.ckpt is None:
                n = n.parent
            if n is None or n.depth == 0:
                return NO_MATCH
            return Match(n.depth, n.ckpt)
        if pos == 0:
            return NO_MATCH
        return Match(pos, self._pick(inside if inside is not None else node))

    @staticmethod
    def _pick(n: Node) -> Checkpoint:
        """A checkpoint at or below n: on the device if any is, else parked."""
        want_device = n.has_device()
        while True:
            c = n.ckpt
            if c is not None and (c.units is not None or not want_device):
                return c
            for child in n.children.values():
                if not want_device or child.has_device():
                    n = child
                    break

    def _touch(self, node: Node) -> None:
        self._tick += 1
        n: Node | None = node
        while n is not None:
            if n.ckpt is not None:
                n.tick = self._tick
                self._push(n)
            n = n.parent

    def _push(self, n: Node) -> None:
        c = n.ckpt
        if c is None:
            return
        if c.units is not None and n.dev_below == 0:
            heappush(self._dev_heap, (n.tick, n.serial, n))
        if c.host is not None and (c.units is not None or not n.children):
            heappush(self._host_heap, (n.tick, n.serial, n))

    # ------------------------------------------------------------------ leases
    def _new_lease(self, tokens: list[int], units: list[list[int]], reserved: int) -> Lease:
        self._ids += 1
        lease = Lease(self._ids, tokens, units, reserved, self._index)
        self._leases[lease.id] = lease
        return lease

    def lease(self, prompt: Sequence[int], reserve: int, *, cache: bool = True) -> Granted | Remap | Refusal:
        """Memory for a request whose worst case is `reserve` tokens (prompt + most new
        tokens), all or nothing. With `cache`, starts from the longest cached prefix; the
        grant's plan copies what must be copied. Then `extend` with the prompt's remaining
        tokens as their state gets written."""
        if reserve < len(prompt):
            raise PoolError(f"pool.lease: reserve ({reserve}) is shorter than the prompt ({len(prompt)})")
        m = self.match(prompt) if cache else NO_MATCH
        return self._start(list(prompt[: m.tokens]), m.checkpoint, reserve)

    def fork(self, parent: Lease, reserve: int) -> Granted | Remap | Refusal:
        """A second lease with `parent`'s tokens: whole pages shared, the page its tokens end
        inside copied, slots copied."""
        self._live(parent, "pool.fork")
        if reserve < len(parent.tokens):
            raise PoolError(f"pool.fork: reserve ({reserve}) is shorter than {parent} ")
        return self._start(list(parent.tokens), parent, reserve)

    def _start(self, tokens: list[int], src: Checkpoint | Lease | None, reserve: int) -> Granted | Remap | Refusal:
        pt, n = self._pt, len(tokens)
        device = src is not None and src.units is not None
        shared = n // pt if device else 0
        pages = _ceil(reserve, pt) - shared
        r = self._admit(pages, 1, held=shared)
        if r is not None:
            return r
        copies: list[Copy] = []
        from_host: list[FromHost] = []
        units: list[list[int]] = []
        for b in self._books:
            k = b.kind.index
            name = b.kind.name
            if src is None:
                mine = [] if b.kind.paged else [b.take()]
            elif device:
                have = src.units[k]  # type: ignore[union-attr]
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
                host = src.host[k]  # type: ignore[index]
                count = _ceil(n, pt) if b.kind.paged else 1
                mine = [b.take() for _ in range(count)]
                for i, u in enumerate(mine):
                    h = host[i]
                    from_host.append(FromHost(name, self.layout.offset(b.kind, h), u))
                    if b.kind.paged and (i + 1) * pt <= n:  # whole pages stay identical to h
                        self._dev_host[k][u] = h
                        self._host_dev[k].setdefault(h, []).append(u)
            if not b.kind.paged:
                b.reserved -= 1
            units.append(mine)
        bound = len(units[self._paged[0].kind.index]) - shared if self._paged else 0
        self._unreserve(bound)
        lease = self._new_lease(tokens, units, pages - bound)
        if isinstance(src, Checkpoint) and src.node is not None:
            self._touch(src.node)
        return Granted(lease, n, Plan(copies=tuple(copies), from_host=tuple(from_host)))

    def _live(self, lease: Lease, where: str) -> None:
        if not lease.alive or self._leases.get(lease.id) is not lease:
            raise PoolError(f"{where}: {lease} is not a live lease of this pool")

    def extend(self, lease: Lease, tokens: Sequence[int], ahead: int = 0) -> Remap | Refusal | None:
        """The runtime wrote the state of `tokens` (appended to the lease), and will write
        `ahead` more tokens' state before it says which tokens they were: pages get bound as
        the lease grows, for `ahead` too; past its reservation it asks the budget for more."""
        self._live(lease, "pool.extend")
        if ahead < 0:
            raise PoolError(f"pool.extend: ahead = {ahead} for {lease}")
        pt = self._pt
        after = len(lease.tokens) + len(tokens) + ahead
        if not self._paged:
            lease.tokens.extend(tokens)
            lease.ahead = ahead
            return None
        have = len(lease.units[self._paged[0].kind.index])
        new = _ceil(after, pt) - have
        if new < 0:  # fewer tokens ahead than pages were bound for
            self._shrink(lease, have + new)
        if new > lease.reserved:
            r = self._admit(new - lease.reserved, 0, held=have + lease.reserved)
            if r is not None:
                return r
            lease.reserved = new
        for b in self._paged:
            pages = lease.units[b.kind.index]
            for _ in range(new):
                pages.append(b.take())
        if new > 0:
            self._unreserve(new)
            lease.reserved -= new
        lease.tokens.extend(tokens)
        lease.ahead = ahead
        return None

    def _shrink(self, lease: Lease, keep: int) -> None:
        """Give back the lease's pages past the first `keep` (bound ahead for tokens a run wrote
        past the request's end); they return to its reservation."""
        extra = 0
        for b in self._paged:
            us = lease.units[b.kind.index]
            extra = len(us) - keep
            for u in reversed(us[keep:]):
                self._release(b.kind.index, u, -1)
            del us[keep:]
        if extra > 0:
            lease.reserved += extra
            for b in self._paged:
                b.reserved += extra

    def advance(self, leases: Sequence[Lease], tokens: Sequence[int]) -> list[tuple[Lease, Remap | Refusal]]:
        """One scheduler step: each lease gets one token. Returns the leases that could not
        grow (past their reservation, and the budget said no) with the answer; the rest grew."""
        pt = self._pt
        paged = [(b, b.kind.index) for b in self._paged]
        stuck: list[tuple[Lease, Remap | Refusal]] = []
        for lease, t in zip(leases, tokens):
            if not lease.alive:
                raise PoolError(f"pool.advance: {lease} is not live")
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
                r = self.extend(lease, (t,))
                if r is not None:
                    stuck.append((lease, r))
                continue
            lease.reserved -= 1
            for b, k in paged:
                lease.units[k].append(b.take())
                b.reserved -= 1
            toks.append(t)
        return stuck

    def _release(self, k: int, u: int, dl: int) -> None:
        b = self._books[k]
        if b.adjust(u, -1, dl):
            h = self._dev_host[k].pop(u, None)
            if h is not None:
                self._host_dev[k][h].remove(u)
                if not self._host_dev[k][h]:
                    del self._host_dev[k][h]

    def free(self, lease: Lease) -> None:
        """Give everything back (an abort, or a request not worth caching)."""
        self._live(lease, "pool.free")
        for k, us in enumerate(lease.units):
            for u in us:
                self._release(k, u, -1)
        self._unreserve(lease.reserved)
        self._end(lease)

    def _end(self, lease: Lease) -> None:
        lease.alive = False
        lease.reserved = 0
        del self._leases[lease.id]

    # ------------------------------------------------------------------ checkpoints
    def checkpoint(self, lease: Lease) -> Checkpoint | None:
        """End the lease; its units freeze in place as a checkpoint in the prefix index.
        If the index holds these very tokens on the device already, that checkpoint is kept
        and this one's units are given back. None for a lease with no tokens."""
        self._live(lease, "pool.checkpoint")
        if lease.ahead:
            lease.ahead = 0
            self._shrink(lease, _ceil(len(lease.tokens), self._pt))
        self._unreserve(lease.reserved)
        tokens = tuple(lease.tokens)
        if not tokens:
            for k, us in enumerate(lease.units):
                for u in us:
                    self._release(k, u, -1)
            self._end(lease)
            return None
        node = self._tree.insert(tokens)
        old = node.ckpt
        if old is not None and old.units is not None:
            for k, us in enumerate(lease.units):
                for u in us:
                    self._release(k, u, -1)
            self._end(lease)
            self._touch(node)
            return old
        for k, us in enumerate(lease.units):
            b = self._books[k]
            for u in us:
                b.adjust(u, 0, -1)
        units = tuple(tuple(us) for us in lease.units)
        self._end(lease)
        if old is not None:  # parked copy of the same tokens: it gets its device state back
            ckpt = old
            ckpt.units = units
        else:
            self._ids += 1
            ckpt = Checkpoint(self._ids, tokens, units)
            ckpt.node = node
            node.ckpt = ckpt
            self._tree.count += 1
        self._dev_below(node, +1)
        self._touch(node)
        return ckpt

    def _dev_below(self, node: Node, d: int) -> None:
        n = node.parent
        while n is not None:
            n.dev_below += d
            if n.dev_below == 0 and n.ckpt is not None:
                self._push(n)
            n = n.parent

    def _drop_device(self, ckpt: Checkpoint) -> None:
        assert ckpt.units is not None and ckpt.node is not None
        for k, us in enumerate(ckpt.units):
            for u in us:
                self._release(k, u, 0)
        ckpt.units = None
        self._dev_below(ckpt.node, -1)
        self._push(ckpt.node)
        if ckpt.host is None:
            self._forget(ckpt)

    def _drop_host(self, ckpt: Checkpoint) -> None:
        assert ckpt.host is not None
        for k, hs in enumerate(ckpt.host):
            hb = self._host[k]
            for h in hs:
                if hb.adjust(h, -1, 0):
                    for u in self._host_dev[k].pop(h, ()):
                        del self._dev_host[k][u]
        ckpt.host = None
        if ckpt.units is None:
            self._forget(ckpt)

    def _forget(self, ckpt: Checkpoint) -> None:
        node = ckpt.node
        assert node is not None
        node.ckpt = None
        ckpt.node = None
        self._tree.count -= 1
        n = self._tree.prune(node)
        while n is not None:
            self._push(n)  # it may have become a leaf
            n = self._tree.prune(n)

    def drop(self, ckpt: Checkpoint) -> None:
        """Forget a checkpoint everywhere (device and host)."""
        if not ckpt.alive:
            raise PoolError(f"pool.drop: {ckpt} is gone already")
        if ckpt.units is not None:
            self._drop_device(ckpt)
        if ckpt.host is not None:
            self._drop_host(ckpt)

    # ------------------------------------------------------------------ host tier
    def _host_make_room(self, missing: list[int]) -> bool:
        """Give each kind enough free host units for `missing` more, moving host chunks to it
        (never-used ones first, then empty ones of kinds with units to spare); all or nothing."""
        chunks = [_ceil(max(0, m - len(hb.free)), hb.per_chunk) for m, hb in zip(missing, self._host)]
        if not any(chunks):
            return True
        src: list[tuple[int, int]] = [(-1, c) for c, o in enumerate(self._host_owner) if o < 0]
        for j, hb in enumerate(self._host):
            if chunks[j]:
                continue
            spare = len(hb.free) - missing[j]
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
                    self._host[j].unmap([chunk])
                self._host[k].map(chunk, chunk, ready=True)
                self._host_owner[chunk] = k
        return True

    def park(self, ckpt: Checkpoint) -> Plan | Evict | NeverFits:
        """Copy a checkpoint into host memory and give its device units back. Units with an
        identical host copy already (shared with a parked checkpoint, or woken from one) are
        not copied again; parking a parked checkpoint copies nothing."""
        if not ckpt.alive or ckpt.node is None:
            raise PoolError(f"pool.park: {ckpt} is gone")
        if ckpt.units is None:
            return EMPTY
        if ckpt.host is not None:
            self._drop_device(ckpt)
            return EMPTY
        missing = [sum(1 for u in us if u not in self._dev_host[k]) for k, us in enumerate(ckpt.units)]
        if not self._host_make_room(missing):
            whole = sum(_ceil(len(us), self._host[k].per_chunk) for k, us in enumerate(ckpt.units))
            if whole > self.layout.host_chunks:
                return NeverFits(whole, self.layout.host_chunks)
            return Evict(tuple((self._books[k].kind.name, len(us)) for k, us in enumerate(ckpt.units)))
        to_host: list[ToHost] = []
        host: list[tuple[int, ...]] = []
        for k, us in enumerate(ckpt.units):
            b, hb, dh = self._books[k], self._host[k], self._dev_host[k]
            mine = []
            for u in us:
                h = dh.get(u)
                if h is None:
                    h = hb.take(lease=False)
                    dh[u] = h
                    self._host_dev[k].setdefault(h, []).append(u)
                    to_host.append(ToHost(b.kind.name, u, self.layout.offset(b.kind, h)))
                else:
                    hb.adjust(h, 1, 0)
                mine.append(h)
            host.append(tuple(mine))
        ckpt.host = tuple(host)
        self._drop_device(ckpt)
        return Plan(to_host=tuple(to_host))

    def _pop(self, heap: list[tuple[int, int, Node]], device: bool) -> Node | None:
        while heap:
            tick, _, n = heap[0]
            c = n.ckpt
            ok = c is not None and n.tick == tick
            if ok and device:
                ok = c.units is not None and n.dev_below == 0  # type: ignore[union-attr]
            elif ok:
                ok = c.host is not None and (c.units is not None or not n.children)  # type: ignore[union-attr]
            if ok:
                return n
            heappop(heap)
        return None

    def evict_one(self) -> Plan | None:
        """Give back the device units of the least recently used checkpoint with no device
        checkpoint below it: parked in the host tier if it has (or can make) room, else
        dropped. The plan copies to host. None when no checkpoint holds device units."""
        n = self._pop(self._dev_heap, device=True)
        if n is None:
            return None
        heappop(self._dev_heap)
        ckpt = n.ckpt
        assert ckpt is not None
        if self.layout.host_chunks == 0:
            self._drop_device(ckpt)
            return EMPTY
        while True:
            r = self.park(ckpt)
            if isinstance(r, Plan):
                return r
            if isinstance(r, NeverFits) or not self._evict_host(keep=ckpt):
                self._drop_device(ckpt)
                return EMPTY

    def _evict_host(self, keep: Checkpoint) -> bool:
        """Drop the least recently used host copy (not keep's); False if there is none."""
        while True:
            n = self._pop(self._host_heap, device=False)
            if n is None:
                return False
            heappop(self._host_heap)
            if n.ckpt is keep:
                continue
            self._drop_host(n.ckpt)  # type: ignore[arg-type]
            return True

    def clear(self) -> None:
        """Forget every checkpoint (device and host)."""
        for n in self._tree.nodes():
            if n.ckpt is not None and n.ckpt.alive:
                self.drop(n.ckpt)

    # ------------------------------------------------------------------ reading
    @property
    def leases(self) -> list[Lease]:
        return list(self._leases.values())

    def checkpoints(self) -> list[Checkpoint]:
        return [n.ckpt for n in self._tree.nodes() if n.ckpt is not None]

    def usage(self) -> dict[str, dict[str, int]]:
        """Per paged or per-sequence state: units mapped, free, promised, cached-only, held;
        host units held. All zeros but `mapped`/`free` when everything is released."""
        out = {}
        for b, hb in zip(self._books, self._host):
            mapped = sum(1 for p, c in enumerate(b.vmap) if c >= 0 and not b.pending[p]) * b.per_chunk
            out[b.kind.name] = {
                "mapped": mapped,
                "free": len(b.free),
                "reserved": b.reserved,
                "cached": b.cached,
                "held": mapped - len(b.free),
                "host_held": sum(1 for r in hb.refs if r),
            }
        out["chunks"] = {"dynamic": self.layout.dynamic, "unmapped": len(self._unmapped), "in_flight": self._in_flight}
        return out

    def check(self) -> None:
        """Raise IntegrityError listing every problem integrity.check finds."""
        from kern.pool.integrity import IntegrityError, check

        problems = check(self)
        if problems:
            raise IntegrityError(problems)
