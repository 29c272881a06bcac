"""The one-budget decision: can a request for units be met now, by a remap, or not at all?

Pure: it sees a snapshot of each kind's counts and answers with moves or a typed refusal.
"""

from __future__ import annotations

from dataclasses import dataclass

from kern.pool.results import Evict, NeverFits, Refusal, Wait
from kern.pool.states import ceil_div


@dataclass(frozen=True, slots=True)
class KindView:
    name: str
    need: int  # units the request needs now
    held: int  # units the requester holds already (for never-fits)
    avail: int  # free units not promised to anyone
    per_chunk: int
    empty: tuple[tuple[int, int], ...]  # (place, chunk) wholly free, donation order
    holes: tuple[int, ...]  # places with nothing mapped, lowest first
    cached: int  # units held by checkpoints only
    mapped: int = 0  # places with a chunk mapped (ready or awaiting a remap)


@dataclass(frozen=True, slots=True)
class Move:
    chunk: int
    src: tuple[int, int] | None  # (kind, place) it leaves; None when it was unmapped
    dst: tuple[int, int]  # (kind, place) it goes to


def decide(
    kinds: tuple[KindView, ...], unmapped: tuple[int, ...], dynamic: int, in_flight: bool
) -> tuple[Move, ...] | Refusal | None:
    """None: it fits as is. Moves: it fits once these chunks move. Else a refusal."""
    short = [max(0, k.need - k.avail) for k in kinds]
    if not any(short):
        return None
    whole = sum(ceil_div(k.need + k.held, k.per_chunk) for k in kinds)
    if whole > dynamic:
        return NeverFits(whole, dynamic)
    if in_flight:
        return Wait("a remap is in flight: run it, call pool.remapped(plan), then ask again")
    donors: list[tuple[tuple[int, int] | None, int]] = [(None, c) for c in unmapped]
    for j, k in enumerate(kinds):
        if short[j]:
            continue
        spare = k.avail - k.need
        for place, chunk in k.empty:
            if spare < k.per_chunk:
                break
            donors.append(((j, place), chunk))
            spare -= k.per_chunk
    needs = [(j, ceil_div(short[j], k.per_chunk)) for j, k in enumerate(kinds) if short[j]]
    spare = len(donors) - sum(n for _, n in needs)
    if spare < 0:
        return _evict_or_wait(kinds, unmapped, short)
    moves: list[Move] = []
    for j, n in needs:
        k = kinds[j]
        # past the shortfall, up to twice the chunks the state has (at most half the spare
        # left): a state that grows a unit at a time (a hybrid's slots, one a sequence) remaps
        # log(n) times, not n times; each remap is a plan the runtime runs at once (on a GPU,
        # address mappings while the device waits) and the others' spare chunks are not in use
        extra = max(0, min(k.mapped - n, spare // 2, len(k.holes) - n))
        spare -= extra
        for i in range(n + extra):
            src, chunk = donors[len(moves)]
            moves.append(Move(chunk, src, (j, k.holes[i])))
    return tuple(moves)


def _evict_or_wait(kinds: tuple[KindView, ...], unmapped: tuple[int, ...], short: list[int]) -> Refusal:
    if not any(k.cached for k in kinds):
        return Wait("live leases hold the memory: ask again when one ends")
    needed = sum(ceil_div(max(0, k.need - k.avail - k.cached), k.per_chunk) for k in kinds)
    spare = len(unmapped) + sum(
        (k.avail + k.cached - k.need) // k.per_chunk for k in kinds if k.avail + k.cached >= k.need
    )
    if needed <= spare:
        return Evict(tuple((k.name, s) for k, s in zip(kinds, short) if s))
    return Wait("live leases hold the memory (evicting every checkpoint would not free enough)")
