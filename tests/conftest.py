"""Every test marked `gpu` skips, saying why, where no CUDA GPU is usable (CI has none)."""

from __future__ import annotations

from functools import cache

import pytest


@cache
def gpu_unavailable() -> str | None:
    """None when a CUDA GPU is usable, else why not."""
    try:
        from kern.runtime.devices.cuda.driver import open_device

        open_device(0)
    except Exception as e:  # noqa: BLE001 - any failure means: skip, saying why
        return f"no usable CUDA GPU: {e}"
    return None


def pytest_runtest_setup(item):
    if item.get_closest_marker("gpu") is not None and (why := gpu_unavailable()):
        pytest.skip(why)
