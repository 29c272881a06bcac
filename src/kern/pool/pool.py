"""The pool: one budget of physical chunks for every paged and per-sequence state, leases,
checkpoints in a prefix tree, and a host tier. It decides and keeps books; plans say what
the runtime must do to memory. No clock, no randomness: LRU runs on a tick counter, every
choice takes the lowest index or the first in insertion order.

`Pool` is the one door: it checks every argument (a handle of another pool, or one that has
ended, is a PoolError naming it, and nothing changes) and hands the work to the part that
keeps those books: admission.py (chunks, promises, remaps), leases.py, checkpoints.py with
index.py (the prefix tree and LRU order), host.py (the host tier).
"""

from __future__ import annotations

from typing import Mapping, Sequence

from kern.pool import integrity
from kern.pool.admission import DeviceBooks
from kern.pool.checkpoints import Checkpoints
from kern.pool.errors import IntegrityError, PoolError, Violation
from kern.pool.handles import Checkpoint, Lease
from kern.pool.host import HostTier
from kern.pool.index import NO_MATCH, PrefixIndex
from kern.pool.leases import Leases
from kern.pool.plans import MemoryPlan
from kern.pool.results import Evict, Granted, Match, NeverFits, Refusal, Remap
from kern.pool.states import Layout, StateDecl, plan_layout


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
        self._device = DeviceBooks(self.layout)
        self._host = HostTier(self.layout, self._device)
        self._index = PrefixIndex()
        self._leases = Leases(self._device, self._host, self._index)
        self._ckpts = Checkpoints(self._device, self._host, self._index, self._leases)
        self.initial_plan = self._device.initial(split)

    # -- the budget -------------------------------------------------------------------------
    def remapped(self, plan: MemoryPlan) -> None:
        """The runtime has run a remap plan: its chunks' units are free to hand out."""
        self._device.remapped(plan)

    # -- leases -----------------------------------------------------------------------------
    def match(self, prompt: Sequence[int]) -> Match:
        """The longest cached prefix of `prompt[:-1]` usable to start a lease (pure).

        With only paged states any prefix works (the page it ends inside gets copied); with a
        per-sequence state too, only a whole checkpoint does (its state holds all its tokens)."""
        return self._index.match(prompt, whole_only=len(self._device.paged) < len(self._device.books))

    def shared(self, prompt: Sequence[int]) -> int:
        """Tokens of `prompt[:-1]` that cached checkpoints hold, whole or not (pure): where a
        snapshot of per-sequence state would let the next prompt that shares them start."""
        return self._index.match(prompt, whole_only=False).tokens

    def lease(self, prompt: Sequence[int], reserve: int, *, cache: bool = True) -> Granted | Remap | Refusal:
        """Memory for a request whose worst case is `reserve` tokens (prompt + most new
        tokens), all or nothing. With `cache`, starts from the longest cached prefix; the
        grant's plan copies what must be copied. Then `extend` with the prompt's remaining
        tokens as their state gets written."""
        if reserve < len(prompt) or reserve < 0:
            raise PoolError(f"pool.lease: reserve ({reserve}) is shorter than the prompt ({len(prompt)} tokens)")
        m = self.match(prompt) if cache else NO_MATCH
        return self._leases.start(list(prompt[: m.tokens]), m.checkpoint, reserve)

    def fork(self, parent: Lease, reserve: int) -> Granted | Remap | Refusal:
        """A second lease with `parent`'s tokens: whole pages shared, the page its tokens end
        inside copied, slots copied."""
        self._leases.check(parent, "pool.fork")
        if reserve < len(parent.tokens) or reserve < 0:
            raise PoolError(f"pool.fork: reserve ({reserve}) is shorter than {parent!r}")
        return self._leases.start(list(parent.tokens), parent, reserve)

    def extend(self, lease: Lease, tokens: Sequence[int], ahead: int = 0) -> Remap | Refusal | None:
        """The runtime wrote the state of `tokens` (appended to the lease), and will write
        `ahead` more tokens' state before it says which tokens they were: pages get bound as
        the lease grows, for `ahead` too; past its reservation it asks the budget for more."""
        self._leases.check(lease, "pool.extend")
        if ahead < 0:
            raise PoolError(f"pool.extend: ahead = {ahead} for {lease!r}")
        return self._leases.extend(lease, tokens, ahead)

    def advance(self, leases: Sequence[Lease], tokens: Sequence[int]) -> list[tuple[Lease, Remap | Refusal]]:
        """One scheduler step: each lease gets one token (leases and tokens pair up, each
        lease once). Returns the leases that could not grow (past their reservation, and the
        budget said no) with the answer; the rest grew."""
        return self._leases.advance(leases, tokens)

    def free(self, lease: Lease) -> None:
        """Give everything back (an abort, or a request not worth caching)."""
        self._leases.check(lease, "pool.free")
        self._leases.free(lease)

    # -- checkpoints ------------------------------------------------------------------------
    def checkpoint(self, lease: Lease) -> Checkpoint | None:
        """End the lease; its units freeze in place as a checkpoint in the prefix index.
        If the index holds these very tokens on the device already, that checkpoint is kept
        and this one's units are given back. None for a lease with no tokens."""
        self._leases.check(lease, "pool.checkpoint")
        return self._ckpts.checkpoint(lease)

    def drop(self, ckpt: Checkpoint) -> None:
        """Forget a checkpoint everywhere (device and host)."""
        self._index.node_of(ckpt, "pool.drop")
        self._ckpts.drop(ckpt)

    def park(self, ckpt: Checkpoint) -> MemoryPlan | Evict | NeverFits:
        """Copy a checkpoint into host memory and give its device units back. Units with an
        identical host copy already (shared with a parked checkpoint, or woken from one) are
        not copied again; parking a parked checkpoint copies nothing."""
        self._index.node_of(ckpt, "pool.park")
        return self._ckpts.park(ckpt)

    def evict_one(self) -> MemoryPlan | None:
        """Give back the device units of the least recently used checkpoint with no device
        checkpoint below it: parked in the host tier if it has (or can make) room, else
        dropped. The plan copies to host. None when no checkpoint holds device units."""
        return self._ckpts.evict_one()

    def clear(self) -> None:
        """Forget every checkpoint (device and host)."""
        self._ckpts.clear()

    # -- reading ----------------------------------------------------------------------------
    @property
    def leases(self) -> list[Lease]:
        return list(self._leases.live.values())

    def checkpoints(self) -> list[Checkpoint]:
        return self._index.checkpoints()

    def usage(self) -> dict[str, dict[str, int]]:
        """Per paged or per-sequence state: units mapped, free, promised, cached-only, held;
        host units held. All zeros but `mapped`/`free` when everything is released."""
        out = {}
        for b, hb in zip(self._device.books, self._host.books):
            mapped = b.opened * b.per_chunk
            out[b.kind.name] = {
                "mapped": mapped,
                "free": b.nfree,
                "reserved": b.reserved,
                "cached": b.cached,
                "held": mapped - b.nfree,
                "host_held": hb.opened * hb.per_chunk - hb.nfree,  # no walk of the units: every step asks
            }
        d = self._device
        out["chunks"] = {"dynamic": self.layout.dynamic, "unmapped": len(d.unmapped), "in_flight": d.in_flight}
        return out

    def host_traffic(self) -> dict[str, int]:
        """Tokens so far: `parked` (checkpoints copied into the host tier to give their device
        units back) and `woken` (leases that started from a host copy instead of recomputing)."""
        return {"parked": self._ckpts.parked_tokens, "woken": self._leases.woken_tokens}

    def check(self) -> None:
        """Raise IntegrityError listing every violation `check(pool)` finds."""
        found = check(self)
        if found:
            raise IntegrityError(found)


def check(pool: Pool) -> list[Violation]:
    """Recount every holder from the leases, checkpoints and host copies and compare with the
    books (integrity.py); empty when they agree."""
    return integrity.check(pool._device, pool._host, pool._index, pool._leases)
