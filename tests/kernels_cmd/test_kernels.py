"""kern kernels: the modules of a manifest, and whether their pinned sha256 are reproduced by
the generator's build from source (found through the kern.generators entry points)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from kern.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CPU = EXAMPLES / "smollm2-135m-instruct-cpu"
SM90A = EXAMPLES / "smollm2-135m-instruct-sm90a"
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="rebuilding cubins needs nvcc")


def test_lists_modules_entries_and_where_they_come_from(capsys):
    assert main(["kernels", str(SM90A), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    mods = {r["module"]: r for r in doc["modules"]}
    m = json.loads((SM90A / "manifest.json").read_text())
    assert set(mods) == set(m["modules"])
    for name, r in mods.items():
        assert r["sha256"] == m["modules"][name]["sha256"] and r["where"]["matches"]
        declared = {l["entry"] for op in m["ops"].values() for l in op["impl"]["launches"] if l.get("module") == name}
        assert {e["entry"] for e in r["entries"]} == declared


def test_cpu_module_is_reproduced(capsys):
    assert main(["kernels", str(CPU), "--rebuild"]) == 0
    out = capsys.readouterr().out
    assert "rebuild (llama): reproduced" in out and out.strip().endswith("1 of 1 modules reproduce their pinned sha256")


def _copy(tmp_path: Path, edit) -> Path:
    dst = tmp_path / "m"
    shutil.copytree(CPU, dst)
    m = json.loads((dst / "manifest.json").read_text())
    edit(dst, m)
    (dst / "manifest.json").write_text(json.dumps(m))
    return dst


def test_a_module_that_differs_from_its_source_fails(tmp_path, capsys):
    def edit(dst, m):  # a changed kernel, pinned: it loads, but its source does not build it
        k = dst / m["modules"]["kernels"]["source"]
        k.write_text(k.read_text() + "\n# changed\n")
        m["modules"]["kernels"]["sha256"] = hashlib.sha256(k.read_bytes()).hexdigest()

    assert main(["kernels", str(_copy(tmp_path, edit)), "--rebuild"]) == 1
    assert "DIFFERS: built" in capsys.readouterr().out


def test_a_module_no_generator_knows_is_not_trusted(tmp_path, capsys):
    def edit(dst, m):
        (dst / m["modules"]["kernels"]["source"]).rename(dst / "kernels" / "mine.py")
        m["modules"]["kernels"]["source"] = "kernels/mine.py"

    assert main(["kernels", str(_copy(tmp_path, edit)), "--rebuild"]) == 1
    assert "NOT REBUILT: no installed generator builds this module" in capsys.readouterr().out


def test_a_pin_the_bytes_do_not_match_is_reported(tmp_path, capsys):
    def edit(dst, m):
        m["modules"]["kernels"]["sha256"] = "0" * 64

    assert main(["kernels", str(_copy(tmp_path, edit))]) == 1
    assert "sha256 MISMATCH" in capsys.readouterr().out


@needs_nvcc
@pytest.mark.parametrize("cubin", ["embed", "argmax"])
def test_nvcc_rebuilds_the_pinned_cubins(cubin):
    from kern.deployments import generators

    (gen,) = [g for g in generators() if g.name == "llama"]
    m = json.loads((SM90A / "manifest.json").read_text())
    data = gen.rebuild(m["modules"][cubin]["source"], "sm_90a")
    assert hashlib.sha256(data).hexdigest() == m["modules"][cubin]["sha256"]


@needs_nvcc
@pytest.mark.slow
def test_the_sm90a_example_is_reproduced_from_source(capsys):
    assert main(["kernels", str(SM90A), "--rebuild"]) == 0
    out = capsys.readouterr().out
    n = len(json.loads((SM90A / "manifest.json").read_text())["modules"])
    assert out.strip().endswith(f"{n} of {n} modules reproduce their pinned sha256")
