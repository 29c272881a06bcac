"""The kern command: its subcommands, and `kern verify PATH... [--json]`."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from kern.cli import main, parser

SUBCOMMANDS = ("run", "test", "bench", "serve", "verify", "cut", "kernels")


def test_every_subcommand_exists():
    sub = next(a for a in parser()._actions if a.dest == "cmd")
    assert set(SUBCOMMANDS) <= set(sub.choices)


@pytest.fixture
def deployment(tmp_path, tiny_dict):
    (tmp_path / "ok").mkdir()
    (tmp_path / "ok" / "manifest.json").write_text(json.dumps(tiny_dict))
    bad = json.loads(json.dumps(tiny_dict))
    bad["vars"]["tokens"]["max"] = 0
    bad["modules"]["kernels"]["sha256"] = "x"
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    return tmp_path


def test_verify_ok(deployment, capsys):
    path = str(deployment / "ok")
    assert main(["verify", path]) == 0
    assert capsys.readouterr().out == f"{path}: ok, 4 programs, 75 calls, 75 launches\n"


def test_verify_failure_lists_every_problem(deployment, capsys):
    path = str(deployment / "bad.json")
    assert main(["verify", str(deployment / "ok"), path]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == f"{path}: manifest failed verification:"
    assert "  vars.tokens.max: must be >= 1, got 0" in lines
    assert "  modules.kernels.sha256: expected 64 lowercase hex digits, got 'x'" in lines


def test_verify_json(deployment, capsys):
    assert main(["verify", "--json", str(deployment / "ok"), str(deployment / "bad.json")]) == 1
    ok, bad = json.loads(capsys.readouterr().out)
    assert ok == {"path": str(deployment / "ok"), "ok": True, "programs": 4, "calls": 75, "launches": 75}
    assert bad["ok"] is False
    assert {"where": "vars.tokens.max", "what": "must be >= 1, got 0"} in bad["problems"]


def test_verify_garbage_is_a_problem_not_a_traceback(tmp_path, capsys):
    (tmp_path / "m.json").write_text('{"schema_version": 1, "model": ')
    assert main(["verify", str(tmp_path / "m.json")]) == 1
    out = capsys.readouterr().out
    assert "truncated JSON" in out and "Traceback" not in out


def test_the_kern_command(deployment):
    kern = shutil.which("kern") or pytest.skip("the kern script is not installed")
    r = subprocess.run([kern, "verify", str(deployment / "bad.json")], capture_output=True, text=True)
    assert r.returncode == 1 and r.stderr == "" and "manifest failed verification:" in r.stdout
    r = subprocess.run([sys.executable, "-m", "kern.cli", "verify", str(deployment / "ok")], capture_output=True,
                       text=True)
    assert r.returncode == 0 and r.stdout.endswith("ok, 4 programs, 75 calls, 75 launches\n")
