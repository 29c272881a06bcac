"""Which device a command runs on when the user does not say: cuda when the driver sees a GPU,
else cpu (the model package ships its pinned kernels: no CUDA toolkit is needed)."""

from __future__ import annotations

import sys
from pathlib import Path


def auto_target() -> tuple[str, str | None]:
    """cuda or cpu; the second value says why not cuda when an NVIDIA device is present, so that
    a fallback is never silent."""
    present = Path("/dev/nvidiactl").exists()
    try:
        from .devices.cuda.driver import open_device

        open_device(0)
    except Exception as exc:  # noqa: BLE001 - any failure of the probe means: run on the cpu
        return "cpu", (f"an NVIDIA device is present but unusable: {exc}" if present else None)
    return "cuda", None


def pick_target(target: str | None, doing: str) -> str:
    """The target given, else the auto target; a fall back to the cpu says why on stderr."""
    if target is None:
        target, why_not_cuda = auto_target()
        if why_not_cuda:
            print(f"[kern] {doing} on the cpu: {why_not_cuda}", file=sys.stderr)
    return target
