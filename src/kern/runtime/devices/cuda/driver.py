"""Driver initialisation, the primary context and checked driver calls.

`drv()` is the only place that imports `cuda.bindings`; `open_device()` initialises the
driver once per process and makes the device's primary context current.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from kern.runtime.devices.cuda.errors import CudaError, CudaUnavailable


NO_GPU = ("this machine has no NVIDIA GPU (no NVIDIA driver device, /dev/nvidiactl or WSL's /dev/dxg): "
          "run on the cpu (leave out --target, or give --target cpu and a cpu deployment)")


def gpu_present() -> bool:
    """Whether the NVIDIA driver exposes a device here (Linux, or WSL's GPU bridge): without
    one, installing CUDA packages would not help, so no error advises it."""
    return Path("/dev/nvidiactl").exists() or Path("/dev/dxg").exists()


@cache
def drv() -> Any:
    """The `cuda.bindings.driver` module, imported on first use."""
    try:
        from cuda.bindings import driver
    except ImportError as e:
        if not gpu_present():
            raise CudaUnavailable(NO_GPU) from e
        raise CudaUnavailable(
            "the CUDA device needs NVIDIA's cuda-bindings package, which is not installed: "
            "pip install 'kern-engine[cuda]'"
        ) from e
    return driver


def error_name(code: Any) -> str:
    try:
        err, name = drv().cuGetErrorName(drv().CUresult(int(code)))
        return name.decode() if err == 0 and name else f"CUresult {int(code)}"
    except Exception:  # noqa: BLE001 - naming an error must never raise another
        return f"CUresult {int(code)}"


def check(result: Any, call: str, where: str = "") -> Any:
    """Unpack a cuda-bindings result tuple (err, *values); raise CudaError on failure."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise CudaError(call, int(err), error_name(err), where)
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def call(name: str, *args: Any, where: str = "") -> Any:
    """Call driver function `name` and check its result."""
    return check(getattr(drv(), name)(*args), name, where)


@dataclass(frozen=True, slots=True)
class GpuContext:
    """An initialised GPU with its primary context current on the calling thread."""

    ordinal: int
    handle: Any  # CUdevice
    context: Any  # CUcontext (primary)
    name: str
    compute_capability: tuple[int, int]
    multiprocessors: int
    max_shared_per_block_optin: int


def _init() -> None:
    d = drv()
    try:
        result = d.cuInit(0)
    except Exception as e:  # DynamicLibNotFoundError or RuntimeError("Failed to dlopen ...")
        raise CudaUnavailable(
            f"no NVIDIA driver on this machine (libcuda.so.1 could not be loaded: {e}); "
            "the CUDA device needs a GPU with its driver installed"
        ) from e
    err = int(result[0] if isinstance(result, tuple) else result)
    if err != 0:
        raise CudaUnavailable(
            f"the NVIDIA driver did not initialise (cuInit returned {error_name(err)} [{err}]): "
            "no usable GPU, or the driver is older than cuda-bindings needs"
        )


@cache
def open_device(ordinal: int = 0) -> GpuContext:
    """Initialise the driver and retain device `ordinal`'s primary context (once per process)."""
    _init()
    d = drv()
    count = call("cuDeviceGetCount")
    if count == 0:
        raise CudaUnavailable("the NVIDIA driver is installed but sees no GPU")
    if not 0 <= ordinal < count:
        raise CudaUnavailable(f"asked for GPU {ordinal}, but the driver sees {count} GPU(s)")
    handle = call("cuDeviceGet", ordinal)
    ctx = call("cuDevicePrimaryCtxRetain", handle, where=f"device {ordinal}")
    call("cuCtxSetCurrent", ctx, where=f"device {ordinal}")
    raw = call("cuDeviceGetName", 256, handle)
    name = (raw if isinstance(raw, bytes) else str(raw).encode()).split(b"\0", 1)[0].decode()
    attr = d.CUdevice_attribute

    def get(a: Any) -> int:
        return call("cuDeviceGetAttribute", a, handle)

    return GpuContext(
        ordinal=ordinal,
        handle=handle,
        context=ctx,
        name=name,
        compute_capability=(
            get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
            get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR),
        ),
        multiprocessors=get(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
        max_shared_per_block_optin=get(attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
    )
