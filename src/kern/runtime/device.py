"""The seam between the engine and a device: what a device must offer to run manifests.

The engine (and kern test) use a device only through these two protocols; `devices/cpu.py`
and `devices/cuda/device.py` implement them. Storage (a buffer's or a state's memory) is
opaque: whatever the device's `alloc` / `alloc_state` returned, handed back to it unchanged."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from .lower import LoweredLaunch

Storage = Any
"""A device's own handle to a buffer's or a state's memory (a numpy array on the cpu, a
device allocation on cuda); only the device that made it looks inside."""


class Program(Protocol):
    """One program lowered onto a device, runnable at any env within the manifest's bounds."""

    runs_steps_natively: bool
    """True when `run_steps` runs its steps on the device without the host in between (on cuda
    one graph launch), so running several decode steps a host wait saves host time; False when
    it loops single steps on the host."""

    def run(self, env: dict[str, int], wait: bool = True) -> None:
        """Run every launch once and wait for the device to finish.

        Args:
            env: constants and var values of this step (already checked against their bounds).
            wait: False: return once launched (the next read waits); the caller writes none of
                this program's inputs before then.
        """

    def run_steps(self, env: dict[str, int], later: list[list[np.ndarray]], varying: list[Storage],
                  feedback: list[tuple[Storage, Storage, int]],
                  collect: list[tuple[Storage, int]], each=None) -> list[list[np.ndarray]]:
        """Run the program 1 + len(later) times back to back (Engine.run_steps); the host waits once.

        Args:
            env: the step's env, the same for every step.
            later: for each step after the first, the new contents of every `varying` input, in
                the order of `varying` (checked and in the buffers' dtypes).
            varying: the input buffers the later steps write (the first step uses what they hold).
            feedback: (output, input, nbytes): after every step, the output's first nbytes are
                copied into the input, on the device (the next step's token).
            collect: (output, nbytes): what to copy back after every step.
            each: None, or called as each(j, step j's collected arrays) as soon as they are on
                the host, before the later steps are done where the device runs ahead of it.

        Returns:
            For each step, the first nbytes of each `collect` output as a uint8 array, in order.
        """


class Device(Protocol):
    """A place to run manifests: memory, module loading, lowering and copies."""

    kind: str
    """The manifest target it runs: cpu or cuda."""

    chunk_granularity: int
    """Bytes a pooled state's chunk must be a multiple of (the device's mapping granularity)."""

    def load_module(self, name: str, data: bytes) -> None:
        """Load a module's bytes (already checked against their pinned sha256).

        Args:
            name: the module's name in the manifest; launches refer to it.
            data: the module itself (cpu: Python source, cuda: a cubin).
        """

    def alloc(self, dtype: str, nelems: int, staged: bool = False) -> Storage:
        """A zeroed buffer.

        Args:
            dtype: a manifest dtype (bf16, f32, i32, ...).
            nelems: elements at the buffer's var maxima.
            staged: an input buffer (only the caller writes it), which a device may write
                through a host mirror that each program uploads itself.

        Returns:
            The buffer's storage.
        """

    def alloc_state(self, nbytes: int, chunk_bytes: int | None = None) -> Storage:
        """A zeroed state.

        Args:
            nbytes: the state's size.
            chunk_bytes: when given, the state is a virtual range of chunks of this size that the
                pool's plans map (`remap`); else it is backed in full.

        Returns:
            The state's storage.
        """

    def remap(self, storage: Storage, unmap: list[int], map: list[tuple[int, int]]) -> None:
        """Unmap chunks of a state's range, then map (physical chunk, place) pairs.

        Args:
            storage: a state from `alloc_state` with chunk_bytes.
            unmap: places to unmap.
            map: (physical chunk, place) pairs to map.
        """

    def write(self, storage: Storage, host: np.ndarray, offset: int = 0) -> None:
        """Write `host`'s values into a buffer or state.

        Args:
            storage: the buffer or state.
            host: the values, in the storage's dtype.
            offset: where they go, in elements of that dtype from the start (bytes, for a state).
        """

    def read(self, storage: Storage, dtype: str, shape: tuple[int, ...], offset: int = 0) -> np.ndarray:
        """A copy of prod(shape) elements of a buffer or state.

        Args:
            storage: the buffer or state.
            dtype: its manifest dtype (u8 for a state).
            shape: the shape to read them as.
            offset: the first element read, from the start (a byte, for a state).

        Returns:
            A new host array.
        """

    def address(self, storage: Storage) -> int:
        """Where a buffer or state starts in the device's address space (what a pointers
        buffer holds).

        Args:
            storage: the buffer or state.

        Returns:
            Its address.
        """

    def copy_bytes(self, storage: Storage, dst: int, src: int, n: int) -> None:
        """Copy n bytes within one storage, from byte offset src to dst (a pool page copy).

        Args:
            storage: the state.
            dst: destination byte offset.
            src: source byte offset.
            n: bytes to copy.
        """

    def lower(self, launches: list[LoweredLaunch], buffers: dict[str, Storage], states: dict[str, Storage],
              graph: bool = False) -> Program:
        """The device's runnable form of a launch list.

        Args:
            launches: a program's launches (or a run of them), from `lower_program`.
            buffers: every buffer's storage, by name.
            states: every state's storage, by name.
            graph: the program may be captured once per shape bucket and replayed.

        Returns:
            The program.
        """

    def synchronize(self) -> None:
        """Wait until everything the device was asked to do is done."""

    def memory(self) -> tuple[int, int] | None:
        """(free, total) bytes of the device's own memory, or None where the device shares the
        host's (a state budget is then the caller's to choose)."""

    def close(self) -> None:
        """Give back everything the device holds (its work done first); once, and nothing may be
        allocated or lowered on it afterwards."""
