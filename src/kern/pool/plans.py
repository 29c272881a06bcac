"""Plans: what the runtime must do to memory, as data. The pool decides; an executor does.

Execute a plan's parts in field order (unmaps, maps, to_host, copies, from_host) and plans in
the order the pool returned them, before the next step that touches the units they name.
Device units are unit indices of the named state; host places are byte offsets in host memory.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Unmap:
    chunk: int  # physical chunk
    state: str
    vchunk: int  # its place in the state's virtual range


@dataclass(frozen=True, slots=True)
class Map:
    chunk: int
    state: str
    vchunk: int


@dataclass(frozen=True, slots=True)
class Copy:
    """Device unit -> device unit of the same state."""

    state: str
    src: int
    dst: int


@dataclass(frozen=True, slots=True)
class ToHost:
    state: str
    unit: int
    host: int  # byte offset of the host range (one unit long)


@dataclass(frozen=True, slots=True)
class FromHost:
    state: str
    host: int
    unit: int


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    unmaps: tuple[Unmap, ...] = ()
    maps: tuple[Map, ...] = ()
    to_host: tuple[ToHost, ...] = ()
    copies: tuple[Copy, ...] = ()
    from_host: tuple[FromHost, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.unmaps or self.maps or self.to_host or self.copies or self.from_host)


EMPTY = MemoryPlan()
