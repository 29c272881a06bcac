"""The fixtures gather the llama cubins and build the test-only kernels once per session (GPU
tests skip without a GPU through tests/conftest.py)."""

from __future__ import annotations

import shutil

import pytest

from tests.cuda.cuda_kernel_docs import TEST_KERNEL_DIR


@pytest.fixture(scope="session")
def device():
    from kern.runtime.devices.cuda.driver import open_device
    return open_device(0)


@pytest.fixture(scope="session")
def cubin_dir(tmp_path_factory):
    """The shipped cubins (built with nvcc where this tree's sources differ from the pins) and
    the test-only kernels of tests/cuda/kernels, built with the same flags."""
    from kern_models.llama.kernels.cuda import CUBINS

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is needed to build the test-only kernels")
    out = tmp_path_factory.mktemp("cubins")
    CUBINS.provide(out)
    CUBINS.build(out, nvcc, srcs=CUBINS.sources(TEST_KERNEL_DIR))
    return out


@pytest.fixture(scope="session")
def gpu(device, cubin_dir):
    from tests.cuda.cuda_gpu import Gpu
    g = Gpu(device, cubin_dir)
    yield g
    g.close()
