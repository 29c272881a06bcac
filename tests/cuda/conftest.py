"""GPU tests (`@pytest.mark.gpu`) skip cleanly on a machine without a usable CUDA GPU; the
fixtures build the llama cubins with nvcc once per session and load them."""

from __future__ import annotations

import importlib.util
import os
import shutil
from functools import cache

import pytest

from cuda_kernel_docs import KERNEL_DIR


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
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is needed to build the kernels")
    spec = importlib.util.spec_from_file_location("llama_cuda_build", KERNEL_DIR / "build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    out = tmp_path_factory.mktemp("cubins")
    # KERN_CUDA_DEFINES="-DNAME=VALUE ...": run the kernel tests on an experimental build
    build.build(out, nvcc, tuple(os.environ.get("KERN_CUDA_DEFINES", "").split()))
    return out


@pytest.fixture(scope="session")
def gpu(device, cubin_dir):
    from cuda_gpu import Gpu
    g = Gpu(device, cubin_dir)
    yield g
    g.close()
