"""The typed table a family's CUDA kernels are declared in (each family's
kernels/cuda/table.py): a kernel's module, entry, parameters, grid, block and role under
programmatic dependent launch, and an op as its kernels launched in order, written out as a
manifest op. The tests check each family's table against its .cu sources
(tests/cuda/test_cuda_table.py)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

ARCH = "sm_90a"  # every family's cubins are built for it (models/common/cubins.py)


class Pdl(Enum):
    """How a kernel is launched and when it lets the next one start (common.cuh says why)."""

    OFF = "off"      # launched without the PDL attribute: starts after everything before it
    LATE = "late"    # with the attribute; waits, then lets the next kernel launch
    EARLY = "early"  # with the attribute; lets the next kernel launch at entry


@dataclass(frozen=True)
class Kernel:
    module: str                # the .cu file (and cubin) it lives in
    entry: str                 # its extern "C" name
    params: tuple[str, ...]    # in the kernel's order: "name: in buffer<bf16>", "name: i32", ...
    grid: tuple                # manifest expressions over param names
    block: tuple
    pdl: Pdl = Pdl.OFF
    # before_wait: what it reads before griddepcontrol.wait ("weights": only weights and the
    # step's inputs; "kv": also K/V rows of earlier positions; "": nothing or no PDL).
    before_wait: str = ""
    writes: tuple[str, ...] | None = None  # params it writes, when not every out/inout param
    shared_mem: int = 0  # dynamic shared memory, bytes
    # params it reads through tensor maps: name -> (rows, elements) of a box (the manifest
    # launch's `tiles`; the kernel gets the map's address)
    tiles: tuple[tuple[str, tuple[int, int]], ...] = ()

    def c_kinds(self) -> tuple[str, ...]:
        """ptr, i32 or f32 for each parameter, as the cubin's layout has them."""
        return tuple("ptr" if ("buffer" in p or "state" in p) else p.split(":")[1].strip() for p in self.params)


def buffer_param(name: str, dtype: str = "bf16", direction: str = "in") -> str:
    """A kernel parameter that is a buffer: "name: in buffer<bf16>"."""
    return f"{name}: {direction} buffer<{dtype}>"


def int_params(*names: str) -> tuple[str, ...]:
    """Kernel parameters that are 32-bit integers: ("n: i32", ...)."""
    return tuple(f"{n}: i32" for n in names)


@dataclass(frozen=True)
class Op:
    """A manifest op: its kernels launched in order. params: the op's parameter order when it is
    not the one kernel's (several kernels, or a parameter only the grid reads)."""

    entries: tuple[str, ...]
    params: tuple[str, ...] | None = None

    def to_manifest(self, by_entry: dict[str, Kernel]) -> dict:
        """by_entry: the family's table, where the entries are looked up."""
        kernels = [by_entry[e] for e in self.entries]
        params = self.params or kernels[0].params
        launches = []
        for k in kernels:
            launch: dict = {"module": k.module, "entry": k.entry}
            if k.pdl is not Pdl.OFF:
                launch["pdl"] = True
            if k.params != params:
                launch["args"] = [p.split(":")[0] for p in k.params]
            if k.writes is not None:
                launch["writes"] = list(k.writes)
            launch["grid"] = list(k.grid)
            launch["block"] = list(k.block)
            if k.shared_mem:
                launch["shared_mem"] = k.shared_mem
            if k.tiles:
                launch["tiles"] = {n: list(box) for n, box in k.tiles}
            launches.append(launch)
        return {"params": list(params), "impl": {"launches": launches}}
