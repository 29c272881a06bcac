"""What the pool manages: declared states, and the chunk geometry they are laid out in.

A state is declared only by size. `paged` states hold `size` bytes per token in pages of
`page_tokens` tokens; `per_seq` states hold `size` bytes per sequence in slots; `fixed` states
hold `size` bytes once. Pages and slots are *units*; a physical chunk holds an integer number
of units of one state. Unit `u` of a state lives at byte `offset(u)` of that state's virtual
range: `(u // per_chunk) * chunk_bytes + (u % per_chunk) * unit_bytes` (= `u * unit_bytes`
when the unit divides the chunk).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from kern.errors import KernError

KINDS = ("paged", "per_seq", "fixed")


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class LayoutError(KernError, ValueError):
    """The declared states cannot be laid out in the budget; the message says which and why."""


@dataclass(frozen=True, slots=True)
class StateDecl:
    name: str
    kind: str  # "paged" (size = bytes per token) | "per_seq" (bytes per sequence) | "fixed" (bytes)
    size: int


@dataclass(frozen=True, slots=True)
class UnitKind:
    """A paged or per-sequence state as the pool sees it: units of `unit_bytes`."""

    index: int
    name: str
    paged: bool
    unit_bytes: int
    per_chunk: int


@dataclass(frozen=True, slots=True)
class FixedState:
    name: str
    bytes: int
    first_chunk: int
    chunks: int


@dataclass(frozen=True, slots=True)
class Layout:
    chunk_bytes: int
    page_tokens: int
    chunks: int  # physical chunks in the device budget
    fixed: tuple[FixedState, ...]  # chunks [0, first dynamic) belong to these, for good
    kinds: tuple[UnitKind, ...]
    host_chunks: int

    @property
    def first_dynamic(self) -> int:
        return sum(f.chunks for f in self.fixed)

    @property
    def dynamic(self) -> int:
        """Chunks shared by pages and slots (each state's virtual range is this many chunks)."""
        return self.chunks - self.first_dynamic

    def kind(self, name: str) -> UnitKind:
        for k in self.kinds:
            if k.name == name:
                return k
        raise KeyError(f"pool: no paged or per-sequence state named {name!r}")

    def offset(self, kind: UnitKind, unit: int) -> int:
        """Byte offset of a unit in its state's virtual range (device) or host chunk range."""
        return (unit // kind.per_chunk) * self.chunk_bytes + (unit % kind.per_chunk) * kind.unit_bytes

    def range_bytes(self, kind: UnitKind) -> int:
        return self.dynamic * self.chunk_bytes


def plan_layout(
    budget_bytes: int,
    states: Sequence[StateDecl],
    page_tokens: int,
    chunk_bytes: int,
    host_bytes: int,
) -> Layout:
    where = "pool"
    if chunk_bytes <= 0:
        raise LayoutError(f"{where}: chunk_bytes must be positive, got {chunk_bytes}")
    if page_tokens <= 0:
        raise LayoutError(f"{where}: page_tokens must be positive, got {page_tokens}")
    if host_bytes < 0:
        raise LayoutError(f"{where}: host_bytes must be >= 0, got {host_bytes}")
    names: list[str] = []
    kinds: list[UnitKind] = []
    fixed: list[FixedState] = []
    first = 0
    for i, s in enumerate(states):
        at = f"{where}: states[{i}] ({s.name!r})"
        if s.name in names:
            raise LayoutError(f"{at}: duplicate state name")
        names.append(s.name)
        if s.kind not in KINDS:
            raise LayoutError(f"{at}: kind must be one of {KINDS}, got {s.kind!r}")
        if s.size <= 0:
            raise LayoutError(f"{at}: size must be positive, got {s.size}")
        if s.kind == "fixed":
            n = ceil_div(s.size, chunk_bytes)
            fixed.append(FixedState(s.name, s.size, first, n))
            first += n
            continue
        unit = s.size * page_tokens if s.kind == "paged" else s.size
        if unit > chunk_bytes:
            what = "a page" if s.kind == "paged" else "a slot"
            raise LayoutError(
                f"{at}: {what} is {unit} bytes, larger than a chunk ({chunk_bytes} bytes); "
                f"raise chunk_bytes or lower page_tokens"
            )
        kinds.append(UnitKind(len(kinds), s.name, s.kind == "paged", unit, chunk_bytes // unit))
    chunks = budget_bytes // chunk_bytes
    if first > chunks:
        raise LayoutError(
            f"{where}: fixed states need {first} chunks of {chunk_bytes} bytes, "
            f"the budget of {budget_bytes} bytes holds {chunks}"
        )
    if kinds and chunks - first < len(kinds):
        raise LayoutError(
            f"{where}: {chunks - first} chunks left after fixed states, "
            f"need at least one per paged or per-sequence state ({len(kinds)})"
        )
    return Layout(chunk_bytes, page_tokens, chunks, tuple(fixed), tuple(kinds), host_bytes // chunk_bytes)
