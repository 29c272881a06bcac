"""Kernel parameters: declared kinds, the expected layout, layout checks and argument packing.

Pure host code (numpy only, no CUDA): the loader checks a cubin's parameter layout
(from cuFuncGetParamInfo) against the declared kinds, and a launch packs Python values into the
`void* kernelParams[]` array that cuLaunchKernel takes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

import numpy as np


class ParamKind(Enum):
    """A kernel parameter's kind; the value is its size in bytes (and its alignment)."""

    POINTER = "ptr"
    I32 = "i32"
    F32 = "f32"
    I64 = "i64"

    @property
    def size(self) -> int:
        return _SIZES[self]


_SIZES = {ParamKind.POINTER: 8, ParamKind.I32: 4, ParamKind.F32: 4, ParamKind.I64: 8}
_ALIASES = {"ptr": ParamKind.POINTER, "pointer": ParamKind.POINTER, "i32": ParamKind.I32,
            "f32": ParamKind.F32, "i64": ParamKind.I64}
_INT_RANGE = {ParamKind.I32: (-(2**31), 2**31 - 1), ParamKind.I64: (-(2**63), 2**63 - 1),
              ParamKind.POINTER: (0, 2**64 - 1)}


def parse_kinds(spec: Sequence[str | ParamKind]) -> tuple[ParamKind, ...]:
    """Kinds from names such as ("ptr", "ptr", "i32", "f32")."""
    kinds = []
    for i, k in enumerate(spec):
        if isinstance(k, ParamKind):
            kinds.append(k)
        elif k in _ALIASES:
            kinds.append(_ALIASES[k])
        else:
            raise ValueError(f"param {i}: unknown kind {k!r} (expected one of ptr, i32, f32, i64)")
    return tuple(kinds)


def expected_layout(kinds: Sequence[ParamKind]) -> list[tuple[int, int]]:
    """(offset, size) of each parameter under the C ABI: each aligned to its own size."""
    layout, end = [], 0
    for k in kinds:
        offset = -(-end // k.size) * k.size
        layout.append((offset, k.size))
        end = offset + k.size
    return layout


def layout_problems(kernel: str, kinds: Sequence[ParamKind],
                    actual: Sequence[tuple[int, int]]) -> list[str]:
    """Every difference between the declared kinds and the cubin's (offset, size) list."""
    problems = []
    if len(actual) != len(kinds):
        problems.append(f"kernel {kernel!r}: declared {len(kinds)} params, cubin has {len(actual)}")
    for i, ((off, size), k) in enumerate(zip(actual, kinds)):
        want_off, want_size = expected_layout(kinds)[i]
        if (off, size) != (want_off, want_size):
            problems.append(
                f"kernel {kernel!r} param {i}: declared {k.value} ({want_size} bytes at offset "
                f"{want_off}), cubin has {size} bytes at offset {off}")
    return problems


@dataclass(frozen=True, slots=True)
class PackedArgs:
    """Arguments laid out for cuLaunchKernel: `address` is a `void**` to pass as kernelParams.

    `slots` holds each value in its own 8-byte slot; `pointers[i]` is the address of slot i.
    Keep this object alive until the launch call returns (the driver copies the values).
    """

    kinds: tuple[ParamKind, ...]
    slots: np.ndarray  # uint64[n]
    pointers: np.ndarray  # uint64[n]

    @property
    def address(self) -> int:
        return int(self.pointers.ctypes.data) if len(self.kinds) else 0


def pack_args(kinds: Sequence[ParamKind], values: Sequence[object], kernel: str = "?") -> PackedArgs:
    """Pack Python values into kernel-parameter slots, checking count, types and ranges."""
    kinds = tuple(kinds)
    if len(values) != len(kinds):
        raise ValueError(f"kernel {kernel!r}: takes {len(kinds)} args, got {len(values)}")
    slots = np.zeros(len(kinds), dtype=np.uint64)
    as_i32, as_f32 = slots.view(np.int32), slots.view(np.float32)
    as_i64 = slots.view(np.int64)
    for i, (k, v) in enumerate(zip(kinds, values)):
        if k is ParamKind.F32:
            if not isinstance(v, (int, float, np.floating, np.integer)) or isinstance(v, bool):
                raise TypeError(f"kernel {kernel!r} arg {i}: f32 expects a number, got {v!r}")
            as_f32[2 * i] = np.float32(v)
            continue
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
            raise TypeError(f"kernel {kernel!r} arg {i}: {k.value} expects an int, got {v!r}")
        lo, hi = _INT_RANGE[k]
        if not lo <= int(v) <= hi:
            raise ValueError(f"kernel {kernel!r} arg {i}: {int(v)} does not fit {k.value}")
        if k is ParamKind.I32:
            as_i32[2 * i] = int(v)
        elif k is ParamKind.I64:
            as_i64[i] = int(v)
        else:
            slots[i] = int(v)
    base = int(slots.ctypes.data)
    pointers = np.arange(len(kinds), dtype=np.uint64) * np.uint64(8) + np.uint64(base)
    return PackedArgs(kinds, slots, pointers)
