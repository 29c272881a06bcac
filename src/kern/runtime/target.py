"""Which device a command runs on when the user does not say: cuda when the driver sees a GPU,
else cpu (the model package ships its pinned kernels: no CUDA toolkit is needed)."""

from __future__ import annotations

import sys

from ..errors import KernError


def auto_target() -> tuple[str, str | None]:
    """cuda or cpu; the second value says why not cuda when an NVIDIA device is present, so that
    a fallback is never silent."""
    from .devices.cuda.driver import gpu_present, open_device

    present = gpu_present()
    try:
        open_device(0)
    except Exception as exc:  # noqa: BLE001 - any failure of the probe means: run on the cpu
        return "cpu", (f"an NVIDIA device is present but unusable: {exc}" if present else None)
    return "cuda", None


def pick_target(target: str | None, doing: str) -> str:
    """The target given, else the auto target; a fall back to the cpu says why on stderr.
    cuda asked for on a machine with no NVIDIA GPU is refused at once, saying so."""
    from .devices.cuda.driver import NO_GPU, gpu_present

    if target == "cuda" and not gpu_present():
        raise KernError(f"--target cuda: {NO_GPU}")
    if target is None:
        target, why_not_cuda = auto_target()
        if why_not_cuda:
            print(f"[kern] {doing} on the cpu: {why_not_cuda}", file=sys.stderr)
    return target
