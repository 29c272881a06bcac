"""An engine inside a host: the host allocates the states and owns the stream.

Engine loads as always (modules, weights, buffers, `once` programs) with a state budget of one
byte (one page a state); `adopt_states` then points each state at the host's memory (checked against the
manifest's host layouts by kern.hosts.layout first) and lowers the programs again, so every
launch reads and writes the host's pages in place. The host enqueues the programs on its own
stream (devices/cuda/hosted.py), inside its own CUDA graphs: kern captures none of its own."""

from __future__ import annotations

from dataclasses import dataclass

from .engine import Engine


@dataclass(frozen=True, slots=True)
class HostMemory:
    """A state's memory that the host allocated (and frees): a device address and its size."""

    ptr: int
    nbytes: int
    pages: int


def adopt_states(engine: Engine, memory: dict[str, HostMemory]) -> None:
    """Point the engine's states at the host's memory and lower its programs again (graph
    flags kept: their library plans are made when a step's launches resolve, never captured)."""
    missing = sorted(set(engine.m.states) - set(memory))
    if missing:
        raise ValueError(f"the host gave no memory for states {', '.join(missing)}")
    for name, mem in memory.items():
        engine.states[name] = mem
        engine.pages[name] = mem.pages
    engine.programs = {p: engine.device.lower(ls, engine.buffers, engine.states, graph=engine.m.programs[p].graph)
                       for p, ls in engine.launches.items()}
