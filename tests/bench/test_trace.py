"""A trace of served steps becomes a kern bench workload: the engine's observer writes one line
per program run (what kern serve --trace attaches after its warm-up), reading it groups the
steps into weighted shapes, and kern bench measures them. A bad trace is one line naming the
file and the line."""

from __future__ import annotations

import json

import pytest

from kern.bench.load import read
from kern.bench.run import bench
from kern.bench.trace import parse, record
from kern.bench.workload import WorkloadError

HEADER = '{"kern_trace": 1, "model": "tiny"}\n'


def test_steps_become_weighted_shapes():
    text = HEADER + "".join(json.dumps(s) + "\n" for s in [
        {"program": "prefill", "rows": [20, 9], "start": [0, 0]},   # 2 x 15 rows -> 16, context 0
        {"program": "decode", "rows": [1, 1], "start": [20, 9]},    # mean start 14.5 -> 16
        {"program": "decode", "rows": [1, 1], "start": [21, 10]},   # 15.5 -> 16
        {"program": "decode", "rows": [1], "start": [40]},          # 40 -> 64
    ])
    wl = parse(text, "t.jsonl")
    assert [(s.groups, s.rows, s.context, s.weight) for s in wl.shapes] == [
        (1, 1, 64, 1.0), (2, 1, 16, 2.0), (2, 16, 0, 1.0)]
    assert wl.to_json()["sweeps"] == [{"trace": "t.jsonl", "steps": 4}]


BAD = {  # name -> (file text, what the line must say)
    "not_json": (HEADER + "{oops\n", "t.jsonl: line 2: not JSON"),
    "no_header": ('{"program": "decode", "rows": [1], "start": [3]}\n', "line 1: not a kern serve trace"),
    "not_an_object": (HEADER + "[1, 2]\n", "line 2: expected a JSON object"),
    "lengths_differ": (HEADER + '{"rows": [1, 1], "start": [3]}\n', "line 2: expected \"rows\""),
    "rows_zero": (HEADER + '{"rows": [0], "start": [3]}\n', "line 2: expected \"rows\""),
    "start_negative": (HEADER + '{"rows": [1], "start": [-1]}\n', "line 2: expected \"rows\""),
    "no_steps": (HEADER, "t.jsonl: the trace holds no steps"),
}


@pytest.mark.parametrize("name", BAD)
def test_a_bad_trace_is_one_line_naming_the_file_and_line(name):
    text, frag = BAD[name]
    with pytest.raises(WorkloadError) as exc:
        parse(text, "t.jsonl")
    assert frag in str(exc.value) and "\n" not in str(exc.value)


def test_a_served_trace_is_a_workload_kern_bench_measures(tiny_a, tiny_ckpt, tmp_path):
    from kern.api import Model
    from kern.generation import SamplingParams

    model = Model(tiny_a / "manifest.json", tiny_ckpt, state_budget=8 << 20)
    path = tmp_path / "served.jsonl"
    w = record(model.engine, path)
    model.generate_batch([[5, 6, 7], [9] * 20], SamplingParams(max_tokens=3))
    w.out.close()
    lines = [json.loads(ln) for ln in path.read_text().splitlines()]
    assert lines[0] == {"kern_trace": 1, "model": "tiny"}
    times = [ln["t"] for ln in lines[1:]]  # the host's clock as each run was handed over
    assert all(isinstance(t, float) for t in times) and times == sorted(times)
    assert {ln["program"] for ln in lines[1:]} == {"prefill", "decode"}
    prefill = [ln for ln in lines[1:] if ln["program"] == "prefill"]
    assert sorted(r for ln in prefill for r in ln["rows"]) == [3, 20] and all(
        s == [0] * len(s) for s in (ln["start"] for ln in prefill))
    wl = read(path)
    doc = bench(tiny_a, tiny_ckpt, wl, samples=1, progress=False)
    assert {s["program"] for s in doc["scenarios"]} == {"prefill", "decode"} and not doc["dropped"]
    assert sum(s["weight"] for s in doc["scenarios"]) == len(lines) - 1


def test_steps_run_ahead_in_one_call_are_traced_one_by_one(tiny_a, tiny_ckpt, tmp_path):
    from kern.api import Model

    model = Model(tiny_a / "manifest.json", tiny_ckpt, state_budget=8 << 20, run_ahead=4)
    path = tmp_path / "ahead.jsonl"
    w = record(model.engine, path)
    model.generate([5, 6, 7], max_tokens=5)
    w.out.close()
    decode = [json.loads(ln) for ln in path.read_text().splitlines()[1:] if '"decode"' in ln]
    assert [d["start"] for d in decode] == [[3], [4], [5], [6]]  # the first token comes from the prefill
    # handed over as one run: written within microseconds (bench/trace_steps.py groups them so)
    assert decode[-1]["t"] - decode[0]["t"] < 2e-4
