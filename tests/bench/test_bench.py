"""kern bench on the CPU with a tiny random llama. Measuring is not testing: these check the
structure (every call attributed, sums consistent, dropped shapes listed, the JSON's fields,
the isolate gate, compare's spans), never speed."""

from __future__ import annotations

import json

import pytest

from tests.judge import planted
from kern.bench.run import bench, bench_compare
from kern.bench.workload import parse
from kern.cli import main

WL = parse("""
samples = 2
[[sweep]]
groups = [1, 2]
rows = [1]
context = [20]
[[sweep]]
groups = [1]
rows = [8]
context = [0]
[[sweep]]
groups = [64]
rows = [1]
context = [0]
""", "wl.toml")

STATS = {"min", "p10", "p50", "p90", "max"}


@pytest.fixture(scope="module")
def doc(tiny_a, tiny_ckpt):
    return bench(tiny_a, tiny_ckpt, WL, isolate=True, progress=False)


def test_the_document_says_what_was_measured(doc, tiny_a):
    import hashlib

    assert doc["kern_bench"] == 1 and doc["model"] == "tiny"
    assert doc["manifest"]["sha256"] == hashlib.sha256((tiny_a / "manifest.json").read_bytes()).hexdigest()
    assert doc["device"]["kind"] == "cpu" and doc["device"]["name"] and doc["device"]["driver"]
    assert doc["ceiling_gbps"] > 0 and doc["workload"]["samples"] == 2
    assert json.loads(json.dumps(doc)) == doc  # plain JSON


def test_dropped_shapes_are_listed_not_errors(doc):
    assert [(d["groups"], d["rows"], d["context"]) for d in doc["dropped"]] == [(64, 1, 0)]
    assert "64 sequences" in doc["dropped"][0]["why"]
    assert [(s["program"], s["groups"], s["rows"]) for s in doc["scenarios"]] == [
        ("decode", 1, 1), ("decode", 2, 1), ("prefill", 1, 8)]


def test_every_call_is_attributed_and_the_sums_agree(doc):
    for sc in doc["scenarios"]:
        calls = sc["calls"]
        assert [c["call"] for c in calls] == list(range(sc["program_calls"]))
        for c in calls:
            assert set(c["us"]) == STATS and c["us"]["min"] <= c["us"]["p50"] <= c["us"]["max"]
            assert c["launches"] >= 1 and c["bytes"] > 0 and c["where"].startswith(f"programs.{sc['program']}.")
        st = sc["step"]
        for k in ("untraced_us", "host_us", "base_us", "calls_us"):
            assert set(st[k]) == STATS
        ck = st["check"]
        assert ck["calls_us"] == st["calls_us"]["p50"] and ck["step_us"] == st["untraced_us"]["p50"]
        # the ratio pairs each sample's calls with the step run beside it: between the extremes
        assert st["calls_us"]["min"] / st["untraced_us"]["max"] <= ck["ratio"]
        assert ck["ratio"] <= st["calls_us"]["max"] / st["untraced_us"]["min"]
        assert ck["ok"] == (abs(ck["ratio"] - 1) <= ck["within"] == 0.05)
        assert sum(o["us"] for o in sc["ops"]) == pytest.approx(sum(c["us"]["p50"] for c in calls))
        assert sum(o["calls"] for o in sc["ops"]) == len(calls)
        assert sum(o["share"] for o in sc["ops"]) == pytest.approx(1.0)


def test_bytes_follow_the_shape(doc):
    one, two = doc["scenarios"][0], doc["scenarios"][1]
    embed = [c for c in one["calls"] if c["op"] == "embed"][0]["bytes"], \
        [c for c in two["calls"] if c["op"] == "embed"][0]["bytes"]
    table = 256 * 64 * 4  # the embedding table is passed whole; ids and rows grow with the batch
    assert embed[1] - table == 2 * (embed[0] - table)


def test_isolate_times_each_distinct_call_cold_and_warm_behind_the_gate(doc):
    for sc in doc["scenarios"]:
        iso = sc["isolate"]
        assert iso["gate"]["ok"], iso["gate"]["what"]
        covered = sorted(i for c in iso["calls"] for i in c["calls"])
        assert covered == list(range(sc["program_calls"]))  # every call stands for one distinct call
        assert len({c["key"] for c in iso["calls"]}) == len(iso["calls"]) < sc["program_calls"]
        for c in iso["calls"]:
            assert set(c["cold_us"]) == STATS and set(c["warm_us"]) == STATS


def test_the_gate_fails_when_the_walk_differs(tiny_a, tiny_ckpt, monkeypatch, tmp_path, capsys):
    from kern.drive.engine_io import EngineIO

    real = EngineIO.run_calls

    def skip_last(self, program, lo, hi, env):  # the walk drops the program's last call
        return [] if hi == len(self.e.m.programs[program].calls) else real(self, program, lo, hi, env)

    monkeypatch.setattr(EngineIO, "run_calls", skip_last)
    wl = tmp_path / "wl.toml"
    wl.write_text("samples = 1\n[[sweep]]\ngroups = 1\nrows = 1\ncontext = 0\n")
    code = main(["bench", str(tiny_a), "--workload", str(wl), "--weights", str(tiny_ckpt), "--isolate",
                 "--json", str(tmp_path / "out.json")])
    err = capsys.readouterr().err
    assert code == 1 and "isolate gate failed" in err
    assert not json.loads((tmp_path / "out.json").read_text())["scenarios"][0]["isolate"]["gate"]["ok"]


def test_compare_prices_the_spans_kern_test_judges(tiny_a, tiny_ckpt, tmp_path):
    cand = planted.reduction_reordered(tiny_a, tmp_path / "b")
    wl = parse("samples = 1\n[[sweep]]\ngroups = 1\nrows = 1\ncontext = 4\n")
    doc = bench_compare(tiny_a, cand, tiny_ckpt, wl, progress=False)
    cmp_ = doc["compare"]
    assert cmp_["manifest"]["path"].startswith(str(cand))
    (sc,) = cmp_["scenarios"]
    linears = sum(c["op"] == "linear" for c in doc["scenarios"][0]["calls"])
    assert len(sc["spans"]) == linears and all(s["ops"] == "linear -> linear" for s in sc["spans"])
    for s in sc["spans"]:
        assert s["delta_us"] == pytest.approx(s["b_us"] - s["a_us"])


def test_the_command_prints_a_table_and_writes_json(tiny_a, tiny_ckpt, tmp_path, capsys):
    wl = tmp_path / "wl.toml"
    wl.write_text("samples = 1\n[[sweep]]\ngroups = 1\nrows = 1\ncontext = [0, 70000]\n")
    code = main(["bench", str(tiny_a), "--workload", str(wl), "--weights", str(tiny_ckpt),
                 "--json", str(tmp_path / "out.json")])
    out = capsys.readouterr().out
    assert "decode: 1 x 1 rows, context 0: step p50" in out
    assert "dropped 1 x 1 rows, context 70000" in out
    doc = json.loads((tmp_path / "out.json").read_text())
    assert doc["kern_bench"] == 1
    # exit 0 only where every shape's calls add up to its step (a busy machine may say otherwise)
    assert code == (0 if all(sc["step"]["check"]["ok"] for sc in doc["scenarios"]) else 1)


def test_calls_that_do_not_add_up_to_the_step_exit_1_and_say_so(tiny_a, tiny_ckpt, monkeypatch, tmp_path, capsys):
    """A step the calls do not account for (here: every untraced step made to take 3x as long)
    makes per-call prices untrustworthy: the table says NOT within and the exit code says so too."""
    from kern.bench.timers import CpuTimer

    real = CpuTimer.step
    monkeypatch.setattr(CpuTimer, "step", lambda self, program, vars: 3 * real(self, program, vars))
    wl = tmp_path / "wl.toml"
    wl.write_text("samples = 2\n[[sweep]]\ngroups = [1, 2]\nrows = 1\ncontext = 0\n")
    code = main(["bench", str(tiny_a), "--workload", str(wl), "--weights", str(tiny_ckpt)])
    cap = capsys.readouterr()
    assert code == 1 and cap.out.count("(NOT within 5%)") == 2
    # a line a shape as it starts, though stderr is no terminal
    assert "[kern] bench: shape 1 of 2, decode 1 x 1 rows at context 0" in cap.err
    assert "[kern] bench: shape 2 of 2, decode 2 x 1 rows at context 0" in cap.err
    assert cap.err.splitlines()[-1].startswith("kern bench: for 2 of 2 shapes the calls do not add up to the step "
                                               "within 5% (first: decode 1 x 1 at context 0: ")


@pytest.mark.parametrize("command,flag,says", [
    ("cut", "--stages N", "pipeline stages to cut the model into (required)"),
    ("test", "--seed SEED", "(default 0)"),
    ("test", "--max-prompt MAX_PROMPT", "(default: one prefill chunk plus two pages)"),
    ("bench", "--samples SAMPLES", "(default: the workload's `samples`, else 5)"),
])
def test_every_flag_has_help_with_its_default(command, flag, says, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines where it likes
    assert f"{flag} {says}" in text or (f"{flag} " in text and says in text.split(f"{flag} ", 1)[1][:200])


def test_chart_png_and_svg(doc, tmp_path):
    pytest.importorskip("matplotlib")
    from kern.bench.report import chart

    for name in ("where.png", "where.svg"):
        chart(doc, tmp_path / name)
        assert (tmp_path / name).stat().st_size > 1000


def test_the_state_is_sized_for_the_workload_or_by_memory(tiny_a, tiny_ckpt):
    # 4 sequences at context 200 + 1 row hold 13 pages of 16 tokens each: 52 pages in all
    wl = parse("samples = 1\n[[sweep]]\ngroups = [1, 4]\nrows = 1\ncontext = 200\n")
    doc = bench(tiny_a, tiny_ckpt, wl, progress=False)
    assert not doc["dropped"] and doc["state_budget"] % 52 == 0
    page = doc["state_budget"] // 52
    short = bench(tiny_a, tiny_ckpt, wl, state_budget=doc["state_budget"] - page, progress=False)
    assert [(s["groups"], s["context"]) for s in short["scenarios"]] == [(1, 200)]
    (dr,) = short["dropped"]
    assert (dr["groups"], dr["why"]) == (4, "4 sequences need 52 pages, the paged state holds 51 (--memory)")


def test_a_workload_carries_speculative_rounds_through_the_verify_program(tiny_a, tiny_ckpt):
    """`round = true`: each step is a round of `rows` rows a sequence (its last token and the
    proposed ones) through the manifest's verify program, priced call by call like any step; a
    round past the program's bounds is dropped with the reason."""
    wl = parse("""
samples = 2
[[sweep]]
groups = [1, 2]
rows = [1, 5]
context = [20]
round = true
[[sweep]]
groups = [4]
rows = [9]
context = [0]
round = true
""", "rounds.toml")
    doc = bench(tiny_a, tiny_ckpt, wl, progress=False)
    assert [(s["program"], s["groups"], s["rows"], s.get("round")) for s in doc["scenarios"]] == [
        ("verify_round", 1, 1, True), ("verify_round", 1, 5, True), ("verify_round", 2, 1, True),
        ("verify_round", 2, 5, True)]
    calls = {c["op"] for c in doc["scenarios"][-1]["calls"]}
    assert {"accept", "sample"} <= calls  # the round's own calls are priced, acceptance included
    (drop,) = doc["dropped"]
    assert (drop["groups"], drop["rows"], drop["round"]) == (4, 9, True) and "'verify_round'" in drop["why"]
    with pytest.raises(Exception) as e:
        parse("[[sweep]]\ngroups = 1\nrows = 2\ncontext = 0\nround = 1\n", "bad.toml")
    assert "bad.toml: sweep[0].round: expected true or false" in str(e.value)
