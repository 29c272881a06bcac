"""`kern serve` as a user runs it: a subprocess on loopback, stopped with Ctrl-C."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from kern.cli import parser


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def engine_processes(pid: int) -> set[int]:
    """The server's spawned children (Linux): its engine process."""
    out = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                out.add(int(child))
    return out


def alive(pids: set[int], timeout: float = 10.0) -> set[int]:
    deadline = time.monotonic() + timeout
    while (left := {p for p in pids if Path(f"/proc/{p}").exists()}) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def wait_up(proc: subprocess.Popen, base: str, timeout: float) -> dict:
    """Once `kern serve` (proc) answers on base: its one model, as /v1/models lists it."""
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, proc.stdout.read()
        assert time.monotonic() < deadline, "kern serve did not come up"
        try:
            with urllib.request.urlopen(base + "/v1/models", timeout=2) as r:
                (model,) = json.load(r)["data"]
                return model
        except OSError:
            time.sleep(0.2)


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["Ctrl-C", "SIGTERM"])
def test_kern_serve_a_checkpoint_folder_then_stop_it(checkpoint, stop):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "kern.cli", "serve", str(checkpoint), "--target", "cpu",
                             "--port", str(port), "--context", "128", "--max-seqs", "4"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        model = wait_up(proc, base, 90)
        assert model["max_model_len"] == 128
        req = urllib.request.Request(base + "/v1/completions", json.dumps(
            {"model": model["id"], "prompt": "w5 w6 w7", "max_tokens": 3, "temperature": 0}).encode(),
            {"Content-Type": "application/json"})
        with urllib.request.urlopen(req) as r:
            assert json.load(r)["usage"]["prompt_tokens"] == 3
        engine = engine_processes(proc.pid)
        assert len(engine) == 1
    finally:
        proc.send_signal(stop)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert "Traceback" not in out
    assert not alive(engine), "the engine process outlived the server"


def test_kern_serve_a_missing_folder_says_so_in_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "kern.cli", "serve", str(tmp_path / "nowhere"), "--target", "cpu"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert r.stderr.strip() == f"kern serve: {tmp_path / 'nowhere'}: not a folder"


@pytest.mark.parametrize("text,size", [("4GiB", 4 << 30), ("512M", 512 << 20), ("2G", 2 << 30), ("1000", 1000 << 20)])
def test_memory_sizes(text, size):
    assert parser().parse_args(["serve", "--memory", text]).state_budget == size


@pytest.mark.parametrize("text", ["3x", "0", "-1GiB", "GiB", "1K"])
def test_a_bad_memory_size_is_refused_in_one_line(text, capsys):
    with pytest.raises(SystemExit) as e:
        parser().parse_args(["serve", f"--memory={text}"])
    assert e.value.code == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert err.startswith("kern serve: error: argument --memory:") and repr(text) in err
