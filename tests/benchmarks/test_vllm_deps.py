"""bench/vllm_deps.py on the CPU, offline: its one-line refusals (a freeze file or a wheel folder
that is not there, a folder without vLLM's wheel), and its stand-in of an installed package,
which the resolver must read as installed at that version (what lets a dry run resolve over the
GPU image's packages without holding them)."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

from tests.benchmarks import scripts

BENCH = Path(__file__).resolve().parents[2] / "bench"
deps = scripts.load("vllm_deps", "bench_vllm_deps")


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH / "vllm_deps.py"), *args], capture_output=True, text=True)


def test_a_missing_input_is_refused_in_one_line(tmp_path):
    freeze = tmp_path / "freeze.txt"
    p = run("--freeze", str(freeze), "--peer-wheels", str(tmp_path))
    assert p.returncode == 2 and p.stderr.strip() == f"bench/vllm_deps.py: --freeze: no such file: {freeze}"
    freeze.write_text("numpy==2.3.5\n")
    p = run("--freeze", str(freeze), "--peer-wheels", str(tmp_path / "none"))
    assert p.returncode == 2 and "--peer-wheels: no such folder" in p.stderr and p.stderr.count("\n") == 1
    p = run("--freeze", str(freeze), "--peer-wheels", str(tmp_path))
    assert p.returncode == 2 and p.stderr.strip() == f"bench/vllm_deps.py: no vllm wheel in {tmp_path}"


@pytest.mark.parametrize("name,version", [("Typing_Extensions", "4.16.0"), ("nvidia-cutlass-dsl", "4.6.0")])
def test_a_stand_in_reads_as_installed_at_its_version(tmp_path, name, version):
    deps.stand_in(tmp_path, name, version)
    dist = next(importlib.metadata.distributions(path=[str(tmp_path)]))
    assert (deps.norm(dist.metadata["Name"]), dist.version) == (deps.norm(name), version)
