"""Virtual-address pools: one set of physical chunks (cuMemCreate), `PhysicalChunks`, and any
number of reserved address ranges cut into slots of the chunk size, `VirtualPool`, each mapping
chunks of that one set. Every pooled state has its own range and all share the chunks: the
state budget is one number, and moving memory from pages to slots is a remap, not a copy.

The pool package decides (pure) and hands over remap plans; this executes them:
`apply(unmap=[slot, ...], map=[(chunk, slot), ...])` unmaps first, then maps, then sets access
once per run of adjacent slots (setting access is the slow call, so it is batched). A chunk is
mapped in at most one place at a time, whichever range holds it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from kern.runtime.devices.cuda.driver import GpuContext, call, drv


def _prop(device: GpuContext) -> Any:
    d = drv()
    prop = d.CUmemAllocationProp()
    prop.type = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = device.ordinal
    return prop


def granularity(device: GpuContext) -> int:
    """The recommended physical chunk granularity in bytes (2 MiB on current GPUs)."""
    d = drv()
    flag = d.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED
    return int(call("cuMemGetAllocationGranularity", _prop(device), flag))


def _runs(slots: Sequence[int]) -> list[tuple[int, int]]:
    """Maximal runs of adjacent slots as (first, count), in slot order."""
    out: list[tuple[int, int]] = []
    for s in sorted(slots):
        if out and out[-1][0] + out[-1][1] == s:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((s, 1))
    return out


class PhysicalChunks:
    """`n_chunks` physical chunks of `chunk_bytes`, and where each is mapped (range, slot)."""

    def __init__(self, device: GpuContext, chunk_bytes: int, n_chunks: int):
        g = granularity(device)
        if chunk_bytes <= 0 or chunk_bytes % g:
            raise ValueError(f"PhysicalChunks: chunk_bytes {chunk_bytes} must be a positive "
                             f"multiple of the allocation granularity {g}")
        if n_chunks < 0:
            raise ValueError(f"PhysicalChunks: need n_chunks >= 0, got {n_chunks}")
        self.device, self.chunk_bytes, self.n_chunks = device, chunk_bytes, n_chunks
        prop = _prop(device)
        self.handles = [call("cuMemCreate", chunk_bytes, prop, 0, where=f"physical chunk {i}")
                        for i in range(n_chunks)]
        self.mapped_at: dict[int, tuple[int, int]] = {}  # chunk -> (range base, slot)

    def release(self) -> None:
        """Free the chunks (every range mapping them released first)."""
        if self.mapped_at:
            raise ValueError(f"PhysicalChunks: {len(self.mapped_at)} chunks are still mapped")
        for i, h in enumerate(self.handles):
            call("cuMemRelease", h, where=f"physical chunk {i}")
        self.handles = []


class VirtualPool:
    """`n_slots` virtual slots of `chunks.chunk_bytes`, into which chunks of `chunks` map."""

    def __init__(self, device: GpuContext, n_slots: int, chunks: PhysicalChunks):
        if n_slots < 1:
            raise ValueError(f"VirtualPool: need n_slots >= 1, got {n_slots}")
        self.device, self.chunks, self.chunk_bytes = device, chunks, chunks.chunk_bytes
        self.n_slots, self.n_chunks = n_slots, chunks.n_chunks
        size = self.chunk_bytes * n_slots
        self.base = int(call("cuMemAddressReserve", size, granularity(device), 0, 0,
                             where=f"VirtualPool reserve {size} bytes"))
        self.chunk_at: dict[int, int] = {}  # slot -> chunk

    def address(self, slot: int) -> int:
        self._slot_ok(slot)
        return self.base + slot * self.chunk_bytes

    def _slot_ok(self, slot: int) -> None:
        if not 0 <= slot < self.n_slots:
            raise ValueError(f"VirtualPool: slot {slot} out of range 0..{self.n_slots - 1}")

    def apply(self, unmap: Iterable[int] = (), map: Iterable[tuple[int, int]] = ()) -> None:
        """Unmap the slots in `unmap`, then map each (chunk, slot) in `map`, then set access."""
        unmap, pairs = list(unmap), list(map)
        for slot in unmap:
            self._slot_ok(slot)
            if slot not in self.chunk_at:
                raise ValueError(f"VirtualPool: slot {slot} is not mapped")
        for slot in unmap:
            call("cuMemUnmap", self.address(slot), self.chunk_bytes, where=f"VirtualPool slot {slot}")
            del self.chunks.mapped_at[self.chunk_at.pop(slot)]
        for chunk, slot in pairs:
            self._slot_ok(slot)
            if not 0 <= chunk < self.n_chunks:
                raise ValueError(f"VirtualPool: chunk {chunk} out of range 0..{self.n_chunks - 1}")
            if slot in self.chunk_at or chunk in self.chunks.mapped_at:
                raise ValueError(f"VirtualPool: cannot map chunk {chunk} at slot {slot}: "
                                 f"{'slot' if slot in self.chunk_at else 'chunk'} already mapped")
            call("cuMemMap", self.address(slot), self.chunk_bytes, 0, self.chunks.handles[chunk], 0,
                 where=f"VirtualPool chunk {chunk} -> slot {slot}")
            self.chunk_at[slot], self.chunks.mapped_at[chunk] = chunk, (self.base, slot)
        d = drv()
        access = d.CUmemAccessDesc()
        access.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        access.location.id = self.device.ordinal
        access.flags = d.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        for first, count in _runs([s for _, s in pairs]):
            call("cuMemSetAccess", self.address(first), count * self.chunk_bytes, [access], 1,
                 where=f"VirtualPool slots {first}..{first + count - 1}")

    def release(self) -> None:
        """Unmap everything and free the address range (the chunks stay, for their owner)."""
        if self.base is None:
            return
        self.apply(unmap=list(self.chunk_at))
        call("cuMemAddressFree", self.base, self.chunk_bytes * self.n_slots)
        self.base = None
