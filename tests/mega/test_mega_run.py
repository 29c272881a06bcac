"""`kern run --mega`: the one-kernel deployment through the host loop; what it cannot do is one
line (exit 1), never a traceback."""

from __future__ import annotations

import pytest

from tests.reliability.conftest import kern, make_tiny


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    monkeypatch.setenv("KERN_CACHE", str(tmp_path / "cache"))
    return make_tiny(tmp_path / "tiny")


def test_mega_with_the_cpu_target_is_one_line(capsys, tiny):
    r = kern(capsys, "run", str(tiny), "--prompt", "w1", "--mega", "--target", "cpu")
    assert r.code == 1 and r.out == "" and "Traceback" not in r.err
    assert r.err.splitlines() == ["kern run: --mega decodes with a CUDA kernel (sm_90a); it does not run with "
                                  "--target cpu"]


def test_a_model_the_kernel_cannot_run_is_one_line_naming_its_config(capsys, tiny):
    r = kern(capsys, "run", str(tiny), "--prompt", "w1", "--mega")  # the tiny model's heads are 16 wide
    assert r.code == 1 and r.out == "" and "Traceback" not in r.err
    (line,) = [ln for ln in r.err.splitlines() if not ln.startswith("[kern]")]
    assert line == (f"kern run: {tiny / 'config.json'}: generator 'llama' cannot build a mega deployment: cannot build "
                    "the sm_90a megakernel manifest: head_dim 16: the megakernel's attention takes 64 or 128")
