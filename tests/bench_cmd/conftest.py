"""A tiny random llama and its cpu deployment: the harness's fixtures, loaded from its
conftest by path (a plain `import conftest` would find whichever conftest came first); gpu
tests skip without a GPU."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

HARNESS = Path(__file__).resolve().parents[1] / "harness"
sys.path.insert(0, str(HARNESS))  # planted.py
_spec = importlib.util.spec_from_file_location("harness_fixtures", HARNESS / "conftest.py")
_fixtures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_fixtures)
tiny_a, tiny_ckpt = _fixtures.tiny_a, _fixtures.tiny_ckpt


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
