"""Pointers buffers: a table of device addresses of the buffers and states a manifest names
(`entries`), filled by the runtime at load, once everything it points to is allocated. A
persistent kernel reads its phases' weights through one (a pointer argument per weight would
not fit a launch's parameter space)."""

from __future__ import annotations

from collections.abc import Callable
from math import prod

import numpy as np

from ..manifest.schema import Manifest
from .errors import DeviceError


def pointer_tables(m: Manifest, shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[str, ...]]:
    """Each pointers buffer's entries, in order; a DeviceError when a buffer is too small to hold
    its table (the verifier checks entries name buffers or states, not the shape)."""
    out = {}
    for name, b in m.buffers.items():
        if b.kind != "pointers":
            continue
        entries = tuple(b.entries or ())
        if len(entries) > prod(shapes[name]):
            raise DeviceError(f"buffers.{name}: a pointers buffer of {prod(shapes[name])} addresses cannot hold "
                              f"its {len(entries)} entries")
        out[name] = entries
    return out


def fill_pointers(tables: dict[str, tuple[str, ...]], address: Callable[[str], int],
                  write: Callable[[str, np.ndarray], None]) -> None:
    """Write each table: address(entry) for every entry, as u64, into its buffer."""
    for name, entries in tables.items():
        write(name, np.array([address(e) for e in entries], dtype=np.uint64))
