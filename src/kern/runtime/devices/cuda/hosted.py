"""A program's launches enqueued on a host's stream (vLLM's current torch stream), inputs
already on the device: no staged upload, no graph of kern's own. Inside the host's CUDA graph
capture the launches are captured like any kernel of the host's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .driver import drv
from .launch import PackedLaunch, launch


@dataclass(frozen=True, slots=True)
class HostStream:
    handle: Any  # CUstream


class Enqueuer:
    """Resolved launch lists, one a (program, env), kept: a step resolves once per shape."""

    def __init__(self) -> None:
        self._items: dict[tuple, list] = {}

    def enqueue(self, program, env: dict[str, int], stream: int) -> None:
        """Every launch of `program` (a CudaProgram) at `env`, on the stream whose handle is `stream`."""
        key = (id(program), tuple(sorted(env.items())))
        items = self._items.get(key)
        if items is None:
            items = self._items[key] = program.resolve(env)
        s = HostStream(drv().CUstream(stream))
        for it in items:
            if isinstance(it, PackedLaunch):
                launch(it, s)
            else:
                it(s)
