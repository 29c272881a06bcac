"""A tiny random llama and its cpu deployment (the harness's fixtures, shared); gpu tests skip
without a GPU."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "harness"))

from conftest import tiny_a, tiny_ckpt  # noqa: E402,F401  (fixtures)


def pytest_runtest_setup(item):
    """`gpu` tests skip, saying why, without a usable CUDA GPU."""
    import pytest

    if item.get_closest_marker("gpu") is None:
        return
    try:
        from kern.runtime.devices.cuda.driver import open_device

        open_device(0)
    except Exception as exc:  # noqa: BLE001 - any failure means: skip, saying why
        pytest.skip(f"no usable CUDA GPU: {exc}")
