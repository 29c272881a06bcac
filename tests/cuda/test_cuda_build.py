"""The pinned cubins rebuild byte for byte (where nvcc of the recorded release exists)."""

import importlib.util
import shutil

import pytest

from cuda_kernel_docs import KERNEL_DIR


def load_build():
    spec = importlib.util.spec_from_file_location("llama_cuda_build", KERNEL_DIR / "build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_recorded_list_covers_every_source():
    build = load_build()
    release, recorded = build.read_recorded()
    assert release, "cubins.sha256 must record the nvcc release"
    assert sorted(recorded) == sorted(f"{s.stem}.cubin" for s in build.sources())
    assert all(len(d) == 64 and int(d, 16) >= 0 for d in recorded.values())


def test_cubins_rebuild_to_the_recorded_sha256(tmp_path):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not installed")
    build = load_build()
    release, recorded = build.read_recorded()
    if build.nvcc_release(nvcc) != release:
        pytest.skip(f"nvcc {build.nvcc_release(nvcc)} differs from the recorded {release}")
    assert build.build(tmp_path, nvcc) == recorded
