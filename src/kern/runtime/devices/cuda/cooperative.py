"""Cooperative launches: a grid whose blocks wait on each other (a software grid barrier) hangs
unless every block is resident at once, so one is refused before it launches when the
occupancy API says the device cannot hold it."""

from __future__ import annotations

from ...errors import DeviceError
from .driver import call
from .launch import PackedLaunch


def coresident_problem(where: str, blocks: int, per_multiprocessor: int, multiprocessors: int,
                       device: str) -> str | None:
    """Why a cooperative grid of `blocks` cannot be co-resident, or None when it can."""
    most = per_multiprocessor * multiprocessors
    if blocks <= most:
        return None
    return (f"{where}: a cooperative grid of {blocks} blocks cannot be co-resident on {device}: it holds at most "
            f"{most} ({per_multiprocessor} a multiprocessor x {multiprocessors}); the manifest's grid must be "
            f"at most that")


def check_coresident(l: PackedLaunch, multiprocessors: int, device: str) -> None:
    """Raise DeviceError when cooperative launch `l` cannot have all its blocks resident."""
    threads = l.block[0] * l.block[1] * l.block[2]
    per = int(call("cuOccupancyMaxActiveBlocksPerMultiprocessor", l.kernel.function, threads, l.shared_mem,
                   where=f"{l.kernel.where} occupancy"))
    problem = coresident_problem(l.kernel.where, l.grid[0] * l.grid[1] * l.grid[2], per, multiprocessors, device)
    if problem:
        raise DeviceError(problem)
