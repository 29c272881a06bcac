"""GPU tests (`@pytest.mark.gpu`) skip cleanly on a machine without a usable CUDA GPU; the
fixtures gather the llama cubins and build the test-only kernels once per session."""

from __future__ import annotations

import os
import shutil
from functools import cache

import pytest

from cuda_kernel_docs import TEST_KERNEL_DIR


@cache
def gpu_unavailable() -> str | None:
    """None when a GPU is usable, else why not."""
    try:
        from kern.runtime.devices.cuda.driver import open_device
        open_device(0)
    except Exception as e:  # noqa: BLE001 - any failure means: skip, saying why
        return f"no usable CUDA GPU: {e}"
    return None


def pytest_runtest_setup(item):
    if item.get_closest_marker("gpu") is not None and (why := gpu_unavailable()):
        pytest.skip(why)


@pytest.fixture(scope="session")
def device():
    from kern.runtime.devices.cuda.driver import open_device
    return open_device(0)


@pytest.fixture(scope="session")
def cubin_dir(tmp_path_factory):
    """The shipped cubins (built with nvcc where this tree's sources differ from the pins) and
    the test-only kernels of tests/cuda/kernels, built with the same flags."""
    from kern_models.llama.cuda import build

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is needed to build the test-only kernels")
    out = tmp_path_factory.mktemp("cubins")
    # KERN_CUDA_VARIANT=NAME: run the kernel tests on a variant of cuda/table.py (VARIANTS)
    variant = os.environ.get("KERN_CUDA_VARIANT") or None
    build.provide(out, variant)
    build.build(out, nvcc, variant, srcs=build.sources(TEST_KERNEL_DIR))
    return out


@pytest.fixture(scope="session")
def gpu(device, cubin_dir):
    from cuda_gpu import Gpu
    g = Gpu(device, cubin_dir)
    yield g
    g.close()
