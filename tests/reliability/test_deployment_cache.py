"""The deployment cache (deployments.deployment_for): a deployment is built under a .build-* name
and renamed into place, a finished one is reused as it is (never regenerated), builds abandoned
by killed runs are cleaned up, and concurrent `kern run`s on one cache all succeed."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from kern import deployments
from kern.files.modules import cache_dir


def _deployments() -> Path:
    return cache_dir() / "deployments"


def test_a_finished_deployment_is_reused_as_is(tiny, monkeypatch, tmp_path):
    monkeypatch.setenv("KERN_CACHE", str(tmp_path / "cache"))
    first = deployments.deployment_for(tiny, "cpu")
    stamp = {p: p.stat().st_mtime_ns for p in first.parent.rglob("*")}
    from kern_models.llama import generator

    def refuse(*a, **k):
        raise AssertionError("a finished deployment was generated again")

    monkeypatch.setattr(generator, "generate", refuse)
    assert deployments.deployment_for(tiny, "cpu") == first
    assert {p: p.stat().st_mtime_ns for p in first.parent.rglob("*")} == stamp
    assert [p.name for p in _deployments().iterdir()] == [first.parent.name], "no .build-* folder is left"


def test_a_build_that_loses_the_race_keeps_the_winner(tiny, monkeypatch, tmp_path):
    monkeypatch.setenv("KERN_CACHE", str(tmp_path / "cache"))
    winner = deployments.deployment_for(tiny, "cpu")
    before = winner.read_bytes(), winner.stat().st_mtime_ns
    from kern_models.llama.generator import GENERATOR

    config = json.loads((tiny / "config.json").read_text())
    again = deployments._build(GENERATOR, config, winner.parent.parent, winner.parent, "cpu", "tiny", {})
    assert again == winner and (winner.read_bytes(), winner.stat().st_mtime_ns) == before
    assert [p.name for p in _deployments().iterdir()] == [winner.parent.name]


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_builds_abandoned_by_killed_runs_are_cleaned(tiny, monkeypatch, tmp_path):
    monkeypatch.setenv("KERN_CACHE", str(tmp_path / "cache"))
    host = socket.gethostname().replace("-", "_")
    root = _deployments()
    dead = root / f".build-{host}-{_dead_pid()}-abc"
    old = root / f".build-{host}-{os.getpid()}-old"
    live = root / f".build-{host}-{os.getpid()}-live"
    other_host = root / ".build-elsewhere-1-x"
    for d in (dead, old, live, other_host):
        (d / "kernels").mkdir(parents=True)
    hours_ago = time.time() - 2 * deployments.STALE_BUILD_S
    os.utime(old, (hours_ago, hours_ago))
    deployments.deployment_for(tiny, "cpu")
    assert not dead.exists() and not old.exists()
    assert live.exists() and other_host.exists(), "a build whose owner may still run is left alone"


ROUNDS, CONCURRENT = 10, 6


def _kern_run(tiny: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kern.cli", "run", str(tiny), "--prompt", "w1 w2 w3",
                           "--max-tokens", "4", "--target", "cpu"],
                          capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.slow
def test_concurrent_kern_runs_on_one_cache(tiny, tmp_path):
    """Six `kern run`s at once on a cold cache (they race to build), then ten rounds of six on
    the warm cache: every run succeeds with the same text, and the deployment is never rebuilt."""
    env = {**os.environ, "KERN_CACHE": str(tmp_path / "cache")}
    failures, texts = [], set()
    with ThreadPoolExecutor(CONCURRENT) as pool:
        for round_ in range(1 + ROUNDS):
            for r in pool.map(lambda _: _kern_run(tiny, env), range(CONCURRENT)):
                texts.add(r.stdout)
                if r.returncode != 0 or "Traceback" in r.stderr:
                    failures.append(f"round {round_}: exit {r.returncode}: {r.stderr.strip()[-300:]}")
            if round_ == 0:
                (deployment,) = (tmp_path / "cache" / "deployments").iterdir()
                stamp = (deployment / "manifest.json").stat().st_mtime_ns
    assert failures == []
    assert len(texts) == 1 and texts.pop().strip()
    assert [p.name for p in (tmp_path / "cache" / "deployments").iterdir()] == [deployment.name]
    assert (deployment / "manifest.json").stat().st_mtime_ns == stamp
