"""The commands' flags: every bad value is refused by the parser naming the flag (exit 2, no
traceback), an explicit 0 is never turned into a default, `kern --version` answers, and
`kern run` piped into a reader that goes away stops quietly."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kern import __version__

from .conftest import kern

RUN_FLAGS = [  # (id, flags, what the message says)
    ("temperature-nan", ["--temperature", "nan"], "argument --temperature: must be a finite number >= 0, got nan"),
    ("temperature-inf", ["--temperature", "inf"], "argument --temperature: must be a finite number >= 0, got inf"),
    ("temperature-negative", ["--temperature", "-0.5"], "argument --temperature: must be a finite number >= 0"),
    ("temperature-word", ["--temperature", "hot"], "argument --temperature: expected a number, got 'hot'"),
    ("seed-negative", ["--seed", "-1"], "argument --seed: must be at least 0, got -1"),
    ("seed-fraction", ["--seed", "1.5"], "argument --seed: expected a whole number, got '1.5'"),
    ("max-tokens-zero", ["--max-tokens", "0"], "argument --max-tokens: must be at least 1, got 0"),
    ("run-ahead-zero", ["--run-ahead", "0"], "argument --run-ahead: must be at least 1, got 0"),
    ("target-unknown", ["--target", "tpu"], "argument --target: invalid choice: 'tpu'"),
    # argv bytes that are not UTF-8 reach Python as lone surrogates
    ("prompt-not-utf8", ["--prompt", "w1 \udcff"], "argument --prompt: not valid UTF-8 text"),
]


@pytest.mark.parametrize("flags,says", [c[1:] for c in RUN_FLAGS], ids=[c[0] for c in RUN_FLAGS])
def test_kern_run_refuses_bad_flags(capsys, flags, says):
    r = kern(capsys, "run", "/nonexistent", *flags)
    assert r.code == 2 and "Traceback" not in r.err and r.out == ""
    assert says in r.err.splitlines()[-1]


TEST_FLAGS = [  # (id, flags, what the message says)
    ("seed-negative", ["--seed", "-3"], "argument --seed: must be at least 0, got -3"),
    ("seqs-zero", ["--seqs", "0"], "argument --seqs: must be at least 1, got 0"),
    ("decode-steps-negative", ["--decode-steps", "-1"], "argument --decode-steps: must be at least 0, got -1"),
    ("max-prompt-zero", ["--max-prompt", "0"], "argument --max-prompt: must be at least 1, got 0"),
    ("kl-limit-nan", ["--kl-limit", "nan"], "argument --kl-limit: must be a finite number >= 0, got nan"),
    ("kl-limit-negative", ["--kl-limit=-1e-3"], "argument --kl-limit: must be a finite number >= 0"),
]


@pytest.mark.parametrize("flags,says", [c[1:] for c in TEST_FLAGS], ids=[c[0] for c in TEST_FLAGS])
def test_kern_test_refuses_bad_flags(capsys, flags, says):
    r = kern(capsys, "test", "--reference", "a", "--candidate", "b", *flags)
    assert r.code == 2 and "Traceback" not in r.err and r.out == ""
    assert says in r.err.splitlines()[-1]


ANY_FLAGS = [  # (id, argv, what the message says): flags every command shares, and the server's
    ("run-memory-inf", ["run", "/nonexistent", "--memory", "inf"], "argument --memory: expected a finite size"),
    ("run-memory-1e400G", ["run", "/nonexistent", "--memory", "1e400G"], "argument --memory: expected a finite size"),
    ("serve-memory-inf", ["serve", "--memory", "inf"], "argument --memory: expected a finite size"),
    ("serve-memory-nan", ["serve", "--memory", "nanG"], "argument --memory: expected a finite size"),
    ("run-memory-1e20G", ["run", "/nonexistent", "--memory", "1e20G"], "argument --memory: must be at most 1024G"),
    ("bench-memory-1e400G", ["bench", "m.json", "--workload", "w.toml", "--memory", "1e400G"],
     "argument --memory: expected a finite size"),
    ("serve-port-70000", ["serve", "--port", "70000"], "argument --port: a TCP port is at most 65535, got 70000"),
    ("serve-port-negative", ["serve", "--port=-1"], "argument --port: must be at least 0, got -1"),
    ("serve-port-word", ["serve", "--port", "http"], "argument --port: expected a whole number, got 'http'"),
    ("serve-target-unknown", ["serve", "--target", "gpu"], "argument --target: invalid choice: 'gpu'"),
]


@pytest.mark.parametrize("argv,says", [c[1:] for c in ANY_FLAGS], ids=[c[0] for c in ANY_FLAGS])
def test_every_command_refuses_bad_flags(capsys, argv, says):
    r = kern(capsys, *argv)
    assert r.code == 2 and "Traceback" not in r.err and r.out == ""
    assert says in r.err.splitlines()[-1]


HELP = [  # (command, words its --help holds, whitespace folded): defaults and meanings shown
    ("run", "--prompt PROMPT the text to continue (default: 'What is the capital of France?'"),
    ("run", "--max-tokens MAX_TOKENS tokens to generate at most (default 64)"),
    ("serve", "--port PORT TCP port to listen on (default 8000"),
    ("serve", "--target {cpu,cuda}"),
    ("test", "--reference A the manifest taken as right"),
    ("test", "--candidate B the manifest judged"),
    ("test", "--json the verdict as JSON"),
]


@pytest.mark.parametrize("command,words", HELP, ids=[f"{c}-{w.split()[0]}" for c, w in HELP])
def test_help_shows_what_each_flag_means_and_its_default(capsys, command, words):
    r = kern(capsys, command, "--help")
    assert r.code == 0 and words in " ".join(r.out.split())


def test_kern_run_says_which_prompt_it_uses_when_none_is_given(capsys, tiny):
    r = kern(capsys, "run", str(tiny), "--target", "cpu", "--max-tokens", "2")
    assert r.code == 0 and "[kern] no --prompt given: 'What is the capital of France?'" in r.err


def test_kern_run_context_1_blames_the_context(capsys, tiny):
    r = kern(capsys, "run", str(tiny), "--prompt", "w1", "--target", "cpu", "--context", "1")
    lines = [ln for ln in r.err.splitlines() if not ln.startswith("[kern]")]
    assert r.code == 1 and r.out == "" and len(lines) == 1, r.err
    assert lines[0] == "kern run: context must be at least 2 positions (a prompt token and a generated one), got 1"


@pytest.mark.skipif(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") >= 1 << 40, reason="a 1 TiB machine")
def test_kern_run_memory_past_the_machine_is_one_line(capsys, tiny):
    r = kern(capsys, "run", str(tiny), "--prompt", "w1", "--target", "cpu", "--memory", "1000G")
    lines = [ln for ln in r.err.splitlines() if not ln.startswith("[kern]")]
    assert r.code == 1 and len(lines) == 1 and "Traceback" not in r.err, r.err
    assert lines[0].startswith("kern run: state budget (--memory) 1000 GiB is more than this machine has")


def _occupied_port():
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


SERVE_PLACES = [  # (id, flags, what the one line says): refused before the model loads
    ("port-in-use", lambda port: ["--port", str(port)], "Address already in use"),
    ("host-not-this-machine", lambda port: ["--host", "192.0.2.1", "--port", "8000"],
     "cannot listen on 192.0.2.1:8000: Cannot assign requested address"),
]


@pytest.mark.parametrize("flags,says", [c[1:] for c in SERVE_PLACES], ids=[c[0] for c in SERVE_PLACES])
def test_kern_serve_that_cannot_listen_says_so_in_one_line_and_never_serving(tiny, flags, says):
    with _occupied_port() as busy:
        r = subprocess.run([sys.executable, "-m", "kern.cli", "serve", str(tiny), "--target", "cpu",
                            *flags(busy.getsockname()[1])], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and r.stdout == "" and "Traceback" not in r.stderr, r.stderr
    (line,) = r.stderr.splitlines()
    assert line.startswith("kern serve: cannot listen on ") and says in line


def test_kern_test_keeps_an_explicit_zero(capsys, monkeypatch, tiny):
    """Seed 0, 0 decode steps (prefill only) and a KL limit of 0 reach the judge as given."""
    from kern.judge import judge

    seen = []
    monkeypatch.setattr(judge, "judge", lambda a, b, w, opts, say: seen.append(opts) or 1 / 0)
    with pytest.raises(ZeroDivisionError):
        kern(capsys, "test", "--reference", "a", "--candidate", "b", "--weights", str(tiny), "--seed", "0",
             "--decode-steps", "0", "--kl-limit", "0")
    (opts,) = seen
    assert (opts.seed, opts.decode_steps, opts.limit, opts.seqs) == (0, 0, 0.0, 6)


def test_version(capsys):
    r = kern(capsys, "--version")
    assert r.code == 0 and r.out.strip() == f"kern {__version__}"


@pytest.mark.skipif(Path("/dev/nvidiactl").exists(), reason="an NVIDIA device is present")
def test_target_cuda_without_a_gpu_is_one_line(capsys, tiny):
    r = kern(capsys, "run", str(tiny), "--prompt", "w1", "--target", "cuda")
    lines = [ln for ln in r.err.splitlines() if not ln.startswith("[kern]")]
    assert r.code == 1 and r.out == "" and "Traceback" not in r.err and len(lines) == 1, r.err
    assert lines[0].startswith("kern run: ") and "cuda" in lines[0]


def test_a_usable_gpu_runs_cuda_without_the_toolkit(monkeypatch):
    """The model package ships its pinned cubins: a usable GPU is a CUDA run even without nvcc."""
    import shutil

    from kern.runtime import target
    from kern.runtime.devices.cuda import driver

    monkeypatch.setattr(driver, "open_device", lambda ordinal=0: None)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert target.auto_target() == ("cuda", None)


def _kern_run(tiny: Path, stdout) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kern.cli", "run", str(tiny), "--prompt", "w1 w2",
                           "--max-tokens", "64", "--target", "cpu"],
                          stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=300)


def test_output_into_a_closed_pipe_ends_quietly(tiny):
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first token is written
    try:
        r = _kern_run(tiny, write)
    finally:
        os.close(write)
    assert r.returncode == 0 and "Traceback" not in r.stderr and "Error" not in r.stderr, r.stderr


def test_output_into_head_ends_quietly(tiny):
    r = subprocess.run(f"{sys.executable} -m kern.cli run {tiny} --prompt 'w1 w2' --max-tokens 200 --target cpu "
                       "2>err | head -c 5; cat err", shell=True, capture_output=True, text=True, timeout=300,
                       cwd=tiny)
    assert len(r.stdout.split("[kern]")[0]) == 5
    assert "Traceback" not in r.stdout and "Error" not in r.stdout, r.stdout
