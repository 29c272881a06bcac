"""Modules, kernels and launches.

A module is loaded from cubin bytes (cuModuleLoadData). `Module.kernel(entry, kinds)` looks the
function up and checks its parameter layout against the declared kinds (cuFuncGetParamInfo),
raising ParamLayoutError that names the module, kernel and position of every mismatch.
A `PackedLaunch` is a fully resolved launch (kernel, geometry, values packed once); `launch()` runs it:
cuLaunchKernel for plain launches, cuLaunchKernelEx for cooperative and/or programmatic
dependent launches (PDL).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kern.runtime.devices.cuda.driver import call, check, drv
from kern.runtime.devices.cuda.errors import CudaError, ParamLayoutError
from kern.runtime.devices.cuda.memory import Stream
from kern.runtime.devices.cuda.params import (
    PackedArgs, ParamKind, layout_problems, pack_args, parse_kinds)

Dim3 = tuple[int, int, int]
STATIC_SHARED = 48 << 10  # dynamic shared memory a launch may take without the function's opt-in


@dataclass(frozen=True, slots=True)
class Kernel:
    """A function in a loaded module, with its checked parameter kinds."""

    module: str
    name: str
    function: Any  # CUfunction
    kinds: tuple[ParamKind, ...]

    @property
    def where(self) -> str:
        return f"module {self.module!r} kernel {self.name!r}"


def param_info(function: Any) -> list[tuple[int, int]]:
    """(offset, size) of every parameter of a loaded function, from cuFuncGetParamInfo."""
    d, out = drv(), []
    while True:
        err, offset, size = d.cuFuncGetParamInfo(function, len(out))
        if int(err) == int(d.CUresult.CUDA_ERROR_INVALID_VALUE):
            return out  # past the last parameter
        check((err,), "cuFuncGetParamInfo", f"param {len(out)}")
        out.append((int(offset), int(size)))


class Module:
    """A cubin loaded into the current context."""

    def __init__(self, image: bytes, name: str):
        self.name = name
        self._image = np.frombuffer(bytes(image), dtype=np.uint8)  # alive while the driver reads it
        self.handle = call("cuModuleLoadData", int(self._image.ctypes.data), where=f"module {name!r}")

    def unload(self) -> None:
        """The module out of the context (its kernels unusable after: CudaDevice.close)."""
        if self.handle is not None:
            call("cuModuleUnload", self.handle, where=f"module {self.name!r}")
            self.handle = None

    def kernel(self, entry: str, kinds: Sequence[str | ParamKind]) -> Kernel:
        declared = parse_kinds(kinds)
        try:
            fn = call("cuModuleGetFunction", self.handle, entry.encode(),
                      where=f"module {self.name!r} kernel {entry!r}")
        except CudaError as e:
            raise ParamLayoutError(f"module {self.name!r} has no kernel {entry!r} ({e.name})") from e
        problems = layout_problems(entry, declared, param_info(fn))
        if problems:
            raise ParamLayoutError(
                f"module {self.name!r}: kernel parameters differ from their declaration:\n  "
                + "\n  ".join(problems))
        return Kernel(self.name, entry, fn, declared)


def _dim3(v: int | Sequence[int]) -> Dim3:
    t = (v,) if isinstance(v, int) else tuple(v)
    if not 1 <= len(t) <= 3 or any(int(x) < 1 for x in t):
        raise ValueError(f"bad launch dimensions {v!r}: 1 to 3 positive ints")
    return tuple(int(x) for x in t) + (1,) * (3 - len(t))  # type: ignore[return-value]


@dataclass(frozen=True, slots=True)
class PackedLaunch:
    """One resolved launch; its arguments are packed once, at construction."""

    kernel: Kernel
    grid: Dim3
    block: Dim3
    args: tuple
    shared_mem: int = 0
    cooperative: bool = False
    pdl: bool = False
    packed: PackedArgs = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "grid", _dim3(self.grid))
        object.__setattr__(self, "block", _dim3(self.block))
        object.__setattr__(self, "args", tuple(self.args))
        object.__setattr__(self, "packed", pack_args(self.kernel.kinds, self.args, self.kernel.name))
        # past the default a function must opt in (before any occupancy query); a kernel without a
        # function is a stand-in that is never launched (the lowering's tests)
        if self.shared_mem > STATIC_SHARED and self.kernel.function is not None:
            d = drv()
            call("cuFuncSetAttribute", self.kernel.function,
                 d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, self.shared_mem,
                 where=f"{self.kernel.where}: {self.shared_mem} bytes of dynamic shared memory")


def _attr(kind: str) -> Any:
    d = drv()
    a = d.CUlaunchAttribute()
    if kind == "cooperative":
        a.id = d.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_COOPERATIVE
        a.value.cooperative = 1
    else:
        a.id = d.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        a.value.programmaticStreamSerializationAllowed = 1
    return a


def launch(l: PackedLaunch, stream: Stream) -> None:
    """Enqueue one launch on `stream`."""
    d, k = drv(), l.kernel
    (gx, gy, gz), (bx, by, bz) = l.grid, l.block
    if not (l.cooperative or l.pdl):
        err = d.cuLaunchKernel(k.function, gx, gy, gz, bx, by, bz, l.shared_mem, stream.handle,
                               l.packed.address, 0)
        check(err, "cuLaunchKernel", f"{k.where} grid {l.grid} block {l.block}")
        return
    cfg = d.CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = gx, gy, gz
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = bx, by, bz
    cfg.sharedMemBytes = l.shared_mem
    cfg.hStream = stream.handle
    attrs = ([_attr("cooperative")] if l.cooperative else []) + ([_attr("pdl")] if l.pdl else [])
    cfg.attrs = attrs
    cfg.numAttrs = len(attrs)
    err = d.cuLaunchKernelEx(cfg, k.function, l.packed.address, 0)
    check(err, "cuLaunchKernelEx", f"{k.where} grid {l.grid} block {l.block}"
          f"{' cooperative' if l.cooperative else ''}{' pdl' if l.pdl else ''}")
