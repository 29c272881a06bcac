"""What the host loop, kern.drive and the server see of an engine (StepEngine), and the one way
to open one for a verified deployment (open_engine): one device's Engine, or a split
deployment's ranks behind the same face (RankedEngine, or under a launcher this process's rank
joined to the others)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import numpy as np

from ..manifest.protocol import ServingProtocol
from ..manifest.verify import Verified
from ..runtime.device import Device
from ..runtime.engine import DEFAULT_STATE_BUDGET, Engine
from ..runtime.lower import LoweredLaunch
from ..runtime.paging import Paging


class StepEngine(Protocol):
    """An engine as the host loop drives it: Engine, RankedEngine and StagedEngine are each one."""

    v: Verified
    protocol: ServingProtocol
    device: Device
    shapes: dict[str, tuple[int, ...]]
    launches: dict[str, list[LoweredLaunch]]
    paging: Paging | None
    observers: list[Callable[[str, dict[str, int], dict[str, np.ndarray]], None]]

    def run(self, program: str, vars: dict[str, int], inputs: dict[str, np.ndarray] | None = None,
            wait: bool = True) -> dict[str, int]: ...

    def run_steps(self, program: str, vars: dict[str, int], inputs: dict[str, np.ndarray],
                  steps: list[dict[str, np.ndarray]], feedback: dict[str, str],
                  collect: list[str]) -> list[dict[str, np.ndarray]]: ...

    def runs_steps_natively(self, program: str) -> bool: ...

    def read(self, buffer: str, env: dict[str, int]) -> np.ndarray: ...

    def read_rows(self, buffer: str, env: dict[str, int], rows: list[int]) -> np.ndarray: ...

    def domain(self, buffer: str) -> tuple[int, int]: ...

    def remap_state(self, state: str, unmap: list[int], map: list[tuple[int, int]]) -> None: ...

    def copy_state(self, state: str, dst: int, src: int, nbytes: int) -> None: ...

    def read_state(self, state: str, offset: int, nbytes: int) -> np.ndarray: ...

    def write_state(self, state: str, offset: int, data: np.ndarray) -> None: ...

    def close(self) -> None: ...


def open_engine(v: Verified, weights: str | Path | None, *, device: Device | None = None,
                state_budget: int | None = DEFAULT_STATE_BUDGET, paged: bool = False,
                host_bytes: int | None = 0, pp: int = 1) -> StepEngine:
    """The engine of the verified deployment `v`. A split deployment (a topology of more than
    one rank, docs/tensor-parallel.md) opens every rank (its sibling rank manifests verified
    once each, `v` not again) and refuses a host tier (the default, None, is none there);
    `device` is for one-device deployments. `host_bytes` None: the host tier's default size.
    `pp` above 1: kern cut's stages of `v` on that many devices, micro-batches in flight
    (kern.world.staged; no host tier)."""
    if pp > 1:
        from .staged import StagedEngine

        return StagedEngine(v, weights, pp, state_budget=state_budget, paged=paged, host_bytes=host_bytes or 0)
    if v.manifest.topology.ranks > 1:
        from .ranks import load_split

        return load_split(v, weights, state_budget=state_budget, paged=paged, host_bytes=host_bytes or 0)
    return Engine(v, weights, device=device, state_budget=state_budget, paged=paged, host_bytes=host_bytes)
