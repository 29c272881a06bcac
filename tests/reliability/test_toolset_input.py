"""Bad input to kern bench, kern cut and kern kernels: every flag and file gets one clear line
naming the problem and its place, exit 1 (2 for usage errors), never a traceback."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from kern.cli import main

GOOD_WL = "samples = 1\n[[sweep]]\ngroups = 1\nrows = 1\ncontext = 0\n"

WORKLOADS = {  # name -> (file text, what the line must say)
    "not_toml": ("samples = = 1", "not valid TOML"),
    "no_sweep": ("samples = 1\n", "needs at least one [[sweep]]"),
    "unknown_top": ("sample = 1\n[[sweep]]\ngroups = 1\nrows = 1\ncontext = 0\n", "unknown field 'sample'"),
    "samples_zero": ("samples = 0\n[[sweep]]\ngroups = 1\nrows = 1\ncontext = 0\n", "samples: expected"),
    "samples_text": ("samples = \"5\"\n[[sweep]]\ngroups = 1\nrows = 1\ncontext = 0\n", "samples: expected"),
    "seed_negative": ("seed = -1\n[[sweep]]\ngroups = 1\nrows = 1\ncontext = 0\n", "seed: expected"),
    "sweep_unknown": ("[[sweep]]\ngroups = 1\nrows = 1\ncontext = 0\nbatch = 2\n", "sweep[0]: unknown field 'batch'"),
    "sweep_missing": ("[[sweep]]\ngroups = 1\nrows = 1\n", "sweep[0]: missing field 'context'"),
    "groups_zero": ("[[sweep]]\ngroups = [1, 0]\nrows = 1\ncontext = 0\n", "sweep[0].groups: 0 is below 1"),
    "rows_text": ("[[sweep]]\ngroups = 1\nrows = [\"a\"]\ncontext = 0\n", "sweep[0].rows: expected"),
    "rows_empty": ("[[sweep]]\ngroups = 1\nrows = []\ncontext = 0\n", "sweep[0].rows: expected"),
    "context_negative": ("[[sweep]]\ngroups = 1\nrows = 1\ncontext = -4\n", "sweep[0].context: -4 is below 0"),
    "context_float": ("[[sweep]]\ngroups = 1\nrows = 1\ncontext = 1.5\n", "sweep[0].context: expected"),
    "weight_zero": ("[[sweep]]\ngroups = 1\nrows = 1\ncontext = 0\nweight = 0\n", "sweep[0].weight"),
    "weight_bool": ("[[sweep]]\ngroups = 1\nrows = 1\ncontext = 0\nweight = true\n", "sweep[0].weight"),
    "all_dropped": ("[[sweep]]\ngroups = 1000\nrows = 1\ncontext = 0\n", "every shape of"),
}


@pytest.fixture(scope="module")
def f(tmp_path_factory, tiny_a):
    """The files the cases name."""
    d = tmp_path_factory.mktemp("inputs")
    (d / "good.toml").write_text(GOOD_WL)
    for name, (text, _) in WORKLOADS.items():
        (d / f"{name}.toml").write_text(text)
    (d / "latin1.toml").write_bytes(b"samples = 1 # \xe9\n")
    (d / "bad.json").write_text("{")
    (d / "unverified").mkdir()
    m = json.loads((tiny_a / "manifest.json").read_text())
    m["buffers"].pop("d_x")
    (d / "unverified" / "manifest.json").write_text(json.dumps(m))
    (d / "full").mkdir()
    (d / "full" / "x").write_text("")
    (d / "a_file").write_text("")
    (d / "not_bench.json").write_text(json.dumps({"hello": 1}))
    (d / "other_bench.json").write_text(json.dumps({"kern_bench": 1, "manifest": {"sha256": "0" * 64},
                                                    "scenarios": []}))
    (d / "empty_ckpt").mkdir()
    return d


def run(argv: list[str], capsys) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse: usage errors
        code = exc.code
    cap = capsys.readouterr()
    return code, cap.err


def one_line(err: str) -> str:
    """The message; for a usage error, argparse's error line under its usage text."""
    lines = err.strip().splitlines()
    if err.startswith("usage:"):
        lines = [l for l in lines if ": error: " in l]
    assert "Traceback" not in err and len(lines) == 1, err
    return lines[0]


# ---- kern cut ------------------------------------------------------------------------------

CUT = [  # (id, argv given (files, manifest, tmp), exit, fragment)
    ("manifest_missing", lambda f, m, t: ["cut", str(f / "nope"), "--stages", "2"], 1, "cannot read"),
    ("manifest_not_json", lambda f, m, t: ["cut", str(f / "bad.json"), "--stages", "2"], 1, "truncated JSON"),
    ("manifest_unverified", lambda f, m, t: ["cut", str(f / "unverified"), "--stages", "2"], 1,
     "manifest failed verification"),
    ("stages_zero", lambda f, m, t: ["cut", str(m), "--stages", "0"], 2, "--stages: must be at least 1"),
    ("stages_text", lambda f, m, t: ["cut", str(m), "--stages", "two"], 2, "--stages: expected a whole number"),
    ("stages_missing", lambda f, m, t: ["cut", str(m)], 2, "--stages"),
    ("stages_too_many", lambda f, m, t: ["cut", str(m), "--stages", "500", "--out", str(t / "o")], 1,
     "need at least 500 weights"),
    ("out_not_empty", lambda f, m, t: ["cut", str(m), "--stages", "2", "--out", str(f / "full")], 1,
     "exists and is not empty"),
    ("out_under_a_file", lambda f, m, t: ["cut", str(m), "--stages", "2", "--out", str(f / "a_file" / "o")], 1,
     "a_file"),
    ("times_missing", lambda f, m, t: ["cut", str(m), "--stages", "2", "--times", str(f / "nope.json"),
                                       "--out", str(t / "o")], 1, "--times"),
    ("times_not_json", lambda f, m, t: ["cut", str(m), "--stages", "2", "--times", str(f / "bad.json"),
                                        "--out", str(t / "o")], 1, "not valid JSON"),
    ("times_not_bench", lambda f, m, t: ["cut", str(m), "--stages", "2", "--times", str(f / "not_bench.json"),
                                         "--out", str(t / "o")], 1, "not kern bench output"),
    ("times_other_manifest", lambda f, m, t: ["cut", str(m), "--stages", "2", "--times",
                                              str(f / "other_bench.json"), "--out", str(t / "o")], 1,
     "measured on another manifest"),
]


@pytest.mark.parametrize("case", CUT, ids=[c[0] for c in CUT])
def test_kern_cut_bad_input(case, f, tiny_a, tmp_path, capsys):
    _, argv, code, frag = case
    got, err = run(argv(f, tiny_a, tmp_path), capsys)
    assert got == code and frag in one_line(err), err
    assert not (tmp_path / "o" / "pipeline.json").exists()


# ---- kern bench ----------------------------------------------------------------------------

BENCH = [
    ("manifest_missing", lambda f, m, w: ["bench", str(f / "nope"), "--workload", str(f / "good.toml")], 1,
     "no manifest.json there"),
    ("manifest_not_json", lambda f, m, w: ["bench", str(f / "bad.json"), "--workload", str(f / "good.toml"),
                                           "--weights", str(w)], 1, "truncated JSON"),
    ("manifest_unverified", lambda f, m, w: ["bench", str(f / "unverified"), "--workload", str(f / "good.toml"),
                                             "--weights", str(w)], 1, "manifest failed verification"),
    ("workload_flag_missing", lambda f, m, w: ["bench", str(m)], 2, "--workload"),
    ("workload_missing", lambda f, m, w: ["bench", str(m), "--workload", str(f / "nope.toml")], 1,
     "--workload"),
    ("workload_not_utf8", lambda f, m, w: ["bench", str(m), "--workload", str(f / "latin1.toml")], 1,
     "not UTF-8"),
    *[(f"workload_{name}", lambda f, m, w, name=name: ["bench", str(m), "--workload", str(f / f"{name}.toml"),
                                                       "--weights", str(w)], 1, frag)
      for name, (_, frag) in WORKLOADS.items()],
    ("weights_not_a_folder", lambda f, m, w: ["bench", str(m), "--workload", str(f / "good.toml"), "--weights",
                                              str(f / "a_file")], 1, "--weights"),
    ("weights_without_tensors", lambda f, m, w: ["bench", str(m), "--workload", str(f / "good.toml"),
                                                 "--weights", str(f / "empty_ckpt")], 1, "empty_ckpt"),
    ("compare_missing", lambda f, m, w: ["bench", str(m), "--workload", str(f / "good.toml"), "--compare",
                                         str(f / "nope")], 1, "--compare"),
    ("json_folder_missing", lambda f, m, w: ["bench", str(m), "--workload", str(f / "good.toml"), "--json",
                                             str(f / "nope" / "out.json")], 1, "--json"),
    ("json_is_a_folder", lambda f, m, w: ["bench", str(m), "--workload", str(f / "good.toml"), "--json",
                                          str(f / "full")], 1, "is a folder"),
    ("chart_suffix", lambda f, m, w: ["bench", str(m), "--workload", str(f / "good.toml"), "--chart",
                                      str(f / "c.pdf")], 1, ".png or .svg"),
    ("samples_zero", lambda f, m, w: ["bench", str(m), "--workload", str(f / "good.toml"), "--samples", "0"], 2,
     "--samples: must be at least 1"),
    ("memory_text", lambda f, m, w: ["bench", str(m), "--workload", str(f / "good.toml"), "--memory", "12X"], 2,
     "--memory: expected a size"),
    ("memory_too_small", lambda f, m, w: ["bench", str(m), "--workload", str(f / "good.toml"), "--memory", "100K"],
     2, "--memory: must be at least 1M"),
]


@pytest.mark.parametrize("case", BENCH, ids=[c[0] for c in BENCH])
def test_kern_bench_bad_input(case, f, tiny_a, tiny_ckpt, capsys):
    _, argv, code, frag = case
    got, err = run(argv(f, tiny_a, tiny_ckpt), capsys)
    assert got == code and frag in one_line(err), err


def test_kern_bench_chart_without_matplotlib_says_how_to_get_it(f, tiny_a, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    got, err = run(["bench", str(tiny_a), "--workload", str(f / "good.toml"), "--chart", str(f / "c.png")], capsys)
    assert got == 1 and "pip install matplotlib" in one_line(err)


# ---- kern kernels --------------------------------------------------------------------------

KERNELS = [
    ("manifest_missing", lambda f, m: ["kernels", str(f / "nope")], 1, "cannot read"),
    ("manifest_not_json", lambda f, m: ["kernels", str(f / "bad.json")], 1, "truncated JSON"),
    ("manifest_unverified", lambda f, m: ["kernels", str(f / "unverified"), "--rebuild"], 1,
     "manifest failed verification"),
    ("manifest_flag_missing", lambda f, m: ["kernels"], 2, "MANIFEST"),
    ("unknown_flag", lambda f, m: ["kernels", str(m), "--rebuilt"], 2, "--rebuilt"),
]


@pytest.mark.parametrize("case", KERNELS, ids=[c[0] for c in KERNELS])
def test_kern_kernels_bad_input(case, f, tiny_a, capsys):
    _, argv, code, frag = case
    got, err = run(argv(f, tiny_a), capsys)
    assert got == code and frag in one_line(err), err


def test_kern_kernels_rebuild_without_nvcc_names_what_is_missing(monkeypatch, capsys):
    examples = Path(__file__).resolve().parents[2] / "examples" / "smollm2-135m-instruct-sm90a"
    monkeypatch.setenv("PATH", "/nonexistent")
    got = main(["kernels", str(examples), "--rebuild"])
    out = capsys.readouterr()
    assert got == 1 and "Traceback" not in out.err
    assert "NOT REBUILT" in out.out and "needs nvcc" in out.out
