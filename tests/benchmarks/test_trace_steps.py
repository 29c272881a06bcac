"""bench/trace_steps.py: where a served run's wall went, step kind by step kind, from kern serve's
trace. Its grouping (a run ahead of k decode steps is one run of k steps: its lines written at
once, each a position on), its kinds (decode, mixed, prompt), its idle gaps left out, its windows, and its
one-line refusal of a trace without times; then a real trace of the tiny model run ahead."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.benchmarks import scripts

BENCH = Path(__file__).resolve().parents[2] / "bench"
ts = scripts.load("trace_steps", "bench_trace_steps")


def step(program: str, rows: list[int], t: float, at: int = 0) -> dict:
    return {"program": program, "rows": rows, "start": [at] * len(rows), "t": t}


LINES = [
    step("prefill", [512, 512], 0.000),          # prompt: 40 ms to the next hand-over
    step("prefill", [1, 1, 256], 0.040),          # mixed: 20 ms
    *[step("decode", [1, 1, 1], 0.06 + 1e-5 * k, 300 + k) for k in range(4)],  # one run of 4 steps: 24 ms
    step("decode", [1, 1, 1], 0.084, 304),        # one decode step: 5 ms
    step("prefill", [1, 1, 256], 0.089),          # mixed: 3 s to the next, the server idle
    step("decode", [1], 3.089),                   # the last hand-over: no wall of its own
]


def test_steps_are_grouped_into_runs_and_timed_to_the_next_hand_over():
    s = ts.summarize(LINES)
    k = s["kinds"]
    assert k["prompt"] == {"runs": 1, "steps": 1, "ms_a_step": 40.0, "ms_a_step_p50": 40.0, "prompt_rows_a_step": 1024.0,
                           "decode_rows_a_step": 0.0, "share": pytest.approx(40 / 89, abs=1e-3)}
    assert (k["mixed"]["runs"], k["mixed"]["ms_a_step"], k["mixed"]["prompt_rows_a_step"],
            k["mixed"]["decode_rows_a_step"]) == (1, 20.0, 256.0, 2.0)
    assert (k["decode"]["runs"], k["decode"]["steps"], k["decode"]["ms_a_step"]) == (2, 5, pytest.approx(29 / 5))
    assert k["decode"]["ms_a_step_p50"] == pytest.approx(5.5, abs=1e-2)  # the runs' own: 6 and 5 ms a step
    assert s["idle_s"] == 3.0 and s["timed_s"] == pytest.approx(0.089)


def test_a_window_keeps_its_steps_only():
    s = ts.summarize(LINES, t_from=0.05, t_to=0.09)
    assert set(s["kinds"]) == {"decode"} and s["kinds"]["decode"]["steps"] == 5


def test_a_trace_without_times_is_refused_in_one_line(tmp_path):
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps({"kern_trace": 1, "model": "m"}) + "\n" +
                    json.dumps({"program": "decode", "rows": [1], "start": [3]}) + "\n")
    p = subprocess.run([sys.executable, str(BENCH / "trace_steps.py"), str(path)], capture_output=True, text=True)
    assert p.returncode == 1 and p.stderr.strip().count("\n") == 0 and "carry no times" in p.stderr
    p = subprocess.run([sys.executable, str(BENCH / "trace_steps.py"), str(tmp_path / "none")], capture_output=True,
                       text=True)
    assert p.returncode == 2 and "no such file" in p.stderr


def test_a_served_trace_reads(tiny_a, tiny_ckpt, tmp_path):
    """The tiny model served two prompts and ran ahead: one prompt step, decode runs of 4 steps."""
    from kern.api import Model
    from kern.bench.trace import record
    from kern.generation import SamplingParams

    model = Model(tiny_a / "manifest.json", tiny_ckpt, state_budget=8 << 20, run_ahead=4)
    path = tmp_path / "served.jsonl"
    w = record(model.engine, path)
    model.generate_batch([[5, 6, 7], [9] * 20], SamplingParams(max_tokens=9))
    w.out.close()
    p = subprocess.run([sys.executable, str(BENCH / "trace_steps.py"), str(path)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    s = json.loads(next(ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")).removeprefix("RESULT "))
    assert s["kinds"]["prompt"]["runs"] == 1 and s["kinds"]["prompt"]["prompt_rows_a_step"] == 23
    assert s["kinds"]["decode"]["steps"] >= 4 and s["kinds"]["decode"]["steps"] % 4 == 0  # whole runs of 4 before the last
