"""The two things the pool hands out, each made only by the pool after its checks. A pool
answers for its own handles only: one from another pool, or one that has ended, is refused
with a PoolError naming it."""

from __future__ import annotations

from kern.pool.errors import PoolError
from kern.pool.states import UnitKind


class Lease:
    """A live request's memory: for each paged state its pages in token order, for each
    per-sequence state one slot, plus pages promised for its worst case (`reserved`).

    `tokens` are the tokens whose state is written (restored from a checkpoint, or written by
    the runtime after `extend`). Pages [len(tokens) // page_tokens:] are the lease's own and
    only it writes them; earlier pages may be shared with checkpoints and other leases.
    `ahead`: tokens past `tokens` whose pages are bound already (a decode run that writes
    several steps before the host learns their tokens); a checkpoint gives their pages back.
    Read-only outside the pool.
    """

    __slots__ = ("id", "tokens", "units", "reserved", "alive", "ahead", "_kinds")

    def __init__(self, id: int, tokens: list[int], units: list[list[int]], reserved: int, kinds: dict[str, UnitKind]):
        self.id = id
        self.tokens = tokens
        self.units = units  # per kind (layout.kinds order): pages, or [slot]
        self.reserved = reserved  # pages promised per paged state, not yet handed out
        self.alive = True
        self.ahead = 0
        self._kinds = kinds  # state name -> its kind in the pool's layout

    def page_table(self, state: str) -> list[int]:
        """Physical page indices of a paged state, in token order (do not mutate)."""
        return self.units[self._kind(state, paged=True).index]

    def slot(self, state: str) -> int:
        """The slot of a per-sequence state."""
        return self.units[self._kind(state, paged=False).index][0]

    def _kind(self, state: str, paged: bool) -> UnitKind:
        k = self._kinds.get(state)
        if k is None or k.paged != paged:
            what = "paged" if paged else "per-sequence"
            raise PoolError(f"{self!r}: the pool has no {what} state named {state!r}")
        return k

    def __len__(self) -> int:
        return len(self.tokens)

    def __repr__(self) -> str:
        return f"Lease(id={self.id}, tokens={len(self.tokens)}, reserved={self.reserved})"


class Checkpoint:
    """A finished request's state, frozen: its tokens and where their state lives, on the
    device (`units`, per kind), in host memory (`host`, host units per kind), or both. The
    pool's prefix index files it by id; it is that pool's while the index files this very
    object there. Read-only outside the pool."""

    __slots__ = ("id", "tokens", "units", "host")

    def __init__(self, id: int, tokens: tuple[int, ...], units: tuple[tuple[int, ...], ...] | None):
        self.id = id
        self.tokens = tokens
        self.units = units
        self.host: tuple[tuple[int, ...], ...] | None = None

    @property
    def on_device(self) -> bool:
        return self.units is not None

    @property
    def parked(self) -> bool:
        return self.host is not None

    @property
    def alive(self) -> bool:
        return self.units is not None or self.host is not None

    def __repr__(self) -> str:
        where = "+".join(w for w, on in (("device", self.on_device), ("host", self.parked)) if on) or "gone"
        return f"Checkpoint(id={self.id}, tokens={len(self.tokens)}, {where})"
