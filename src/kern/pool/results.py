"""What a request for memory gets back: a grant, a remap to run first, or a typed refusal."""

from __future__ import annotations

from dataclasses import dataclass
from kern.pool.handles import Checkpoint, Lease
from kern.pool.plans import MemoryPlan


@dataclass(frozen=True, slots=True)
class Granted:
    lease: Lease
    cached: int  # tokens restored from a checkpoint (their state is in place once `plan` runs)
    plan: MemoryPlan


@dataclass(frozen=True, slots=True)
class Remap:
    """One kind of unit ran short while another sat free: run `plan`, call
    `pool.remapped(plan)` once it is done, then ask again."""

    plan: MemoryPlan


class Refusal:
    """Base of the typed refusals; nothing was changed."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Wait(Refusal):
    """Not now: a remap is in flight, or live leases hold the memory. Ask again later."""

    why: str


@dataclass(frozen=True, slots=True)
class Evict(Refusal):
    """Something cached must go (`pool.evict_one()` until this turns into something else)."""

    short: tuple[tuple[str, int], ...]  # (state, units short)


@dataclass(frozen=True, slots=True)
class NeverFits(Refusal):
    """Larger than the whole pool: no amount of waiting or evicting helps."""

    chunks_needed: int
    chunks_in_pool: int


@dataclass(frozen=True, slots=True)
class Match:
    """The longest usable cached prefix of a prompt (the prompt minus its last token)."""

    tokens: int
    checkpoint: Checkpoint | None
