"""kern cut: stages that verify, bind only their weights, and chain back to the uncut logits
bit for bit (run through kern test's script and verdict)."""

from __future__ import annotations

import json

import pytest

from kern.cli import main
from kern.judge.judge import Options
from kern.judge.pipeline import judge_pipeline
from kern.cut.plan import CutError, plan, stage_manifest
from kern.manifest.verify import load_verified, verify_text

SMALL = Options(seed=0, seqs=3, decode_steps=3, max_prompt=40)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_each_stage_verifies_and_the_weights_are_split(tiny_a, n):
    v = load_verified(tiny_a)
    p = plan(v, n)
    seen: list[str] = []
    for k in range(n):
        doc = stage_manifest(v, p, k)
        assert verify_text(json.dumps(doc), f"stage{k}", tiny_a).verified is not None
        weights = [b for b, x in doc["buffers"].items() if x["kind"] == "weight"]
        assert weights and all(p.owner[w] == k for w in weights)
        seen += weights
    assert sorted(seen) == sorted(b for b, x in v.manifest.buffers.items() if x.kind == "weight")


def test_carried_activations_are_inputs_or_carries_of_the_next_stage(tiny_a):
    v = load_verified(tiny_a)
    p = plan(v, 2)
    first, second = stage_manifest(v, p, 0), stage_manifest(v, p, 1)
    decode = [s for s in p.of("decode")]
    assert decode[0].sends and set(decode[0].sends) == set(decode[1].receives)
    for b in decode[1].receives:
        assert first["buffers"][b]["kind"] == "output"
        assert second["buffers"][b]["kind"] in ("input", "carry")
    calls = [c for s in decode for c in v.manifest.programs["decode"].calls[s.lo:s.hi]]
    assert calls == v.manifest.programs["decode"].calls  # every call, once, in order


def test_stages_balance_weight_bytes(tiny_a):
    p = plan(load_verified(tiny_a), 2)
    assert abs(p.cost[0] - p.cost[1]) / sum(p.cost) < 0.2


@pytest.mark.parametrize("n", [2, 3])
def test_the_pipeline_passes_kern_test_bit_identical(tiny_a, tiny_ckpt, tmp_path, n):
    assert main(["cut", str(tiny_a), "--stages", str(n), "--out", str(tmp_path / "cut")]) == 0
    r = judge_pipeline(tiny_a, tmp_path / "cut", tiny_ckpt, SMALL)
    assert (r.verdict.status, r.verdict.kind) == ("PASS", "bit-identical"), r.verdict.line


def test_a_seam_that_drops_a_carried_buffer_fails(tiny_a, tiny_ckpt, tmp_path):
    """The test can fail: stage 1 no longer receives the residual stream."""
    assert main(["cut", str(tiny_a), "--stages", "2", "--out", str(tmp_path / "cut")]) == 0
    doc = json.loads((tmp_path / "cut" / "pipeline.json").read_text())
    for seg in doc["programs"]["decode"]:
        seg["receives"] = [b for b in seg["receives"] if b != "d_x"]
    (tmp_path / "cut" / "pipeline.json").write_text(json.dumps(doc))
    r = judge_pipeline(tiny_a, tmp_path / "cut", tiny_ckpt, SMALL)
    assert r.verdict.status == "FAIL", r.verdict.line


def test_kern_test_takes_the_cut_folder_as_candidate(tiny_a, tiny_ckpt, tmp_path, capsys):
    assert main(["cut", str(tiny_a), "--stages", "2", "--out", str(tmp_path / "cut")]) == 0
    code = main(["test", "--reference", str(tiny_a), "--candidate", str(tmp_path / "cut"),
                 "--weights", str(tiny_ckpt), "--seqs", "2", "--decode-steps", "2", "--max-prompt", "20"])
    assert code == 0 and capsys.readouterr().out.strip().splitlines()[-1].startswith("PASS (bit-identical)")


def test_times_from_kern_bench_move_the_cut(tiny_a):
    v = load_verified(tiny_a)
    calls = v.manifest.programs["decode"].calls
    by_bytes = plan(v, 2)
    # all the time in the last call (the argmax after the LM head): the cut moves to the end
    times = {"decode": [0.0] * (len(calls) - 1) + [1000.0]}
    by_time = plan(v, 2, times)
    assert by_time.weights == by_bytes.weights
    assert [s.lo for s in by_time.of("decode")] != [s.lo for s in by_bytes.of("decode")]


def test_more_stages_than_weights_is_refused(tiny_a):
    with pytest.raises(CutError, match="need at least"):
        plan(load_verified(tiny_a), 1000)


def test_the_sm90a_example_cuts_into_stages_that_verify(tmp_path):
    """No GPU needed to cut: the cubins are copied, the stages verified (the GPU run is in
    tests/bench/test_bench_gpu.py)."""
    from pathlib import Path

    from kern.cut.stages import write_stages

    sm90a = Path(__file__).resolve().parents[2] / "examples" / "smollm2-135m-instruct-sm90a"
    write_stages(sm90a, 2, tmp_path / "s")
    for k in (0, 1):
        v = load_verified(tmp_path / "s" / f"stage{k}")
        assert v.manifest.target.arch == "sm_90a"
        for mod in v.manifest.modules.values():
            assert (tmp_path / "s" / f"stage{k}" / mod.source).is_file()


def test_cut_reads_kern_bench_json_as_times(tiny_a, tiny_ckpt, tmp_path, capsys):
    from kern.bench.run import bench
    from kern.bench.workload import parse

    doc = bench(tiny_a, tiny_ckpt, parse("samples = 1\n[[sweep]]\ngroups = 1\nrows = [1, 4]\ncontext = 4\n"),
                progress=False)
    (tmp_path / "b.json").write_text(json.dumps(doc))
    assert main(["cut", str(tiny_a), "--stages", "2", "--times", str(tmp_path / "b.json"),
                 "--out", str(tmp_path / "cut")]) == 0
    assert " us" in capsys.readouterr().out  # stages priced in time, not bytes
    assert json.loads((tmp_path / "cut" / "pipeline.json").read_text())["stages"] == ["stage0", "stage1"]


def test_a_call_timed_below_zero_costs_nothing_in_the_balance(tmp_path):
    from kern.cut.stages import read_times

    call = {"call": 0, "us": {"p50": -1.5}}
    doc = {"kern_bench": 1, "manifest": {"sha256": "ab"}, "scenarios": [
        {"program": "decode", "program_calls": 2, "weight": 2.0, "calls": [call, {"call": 1, "us": {"p50": 3.0}}]}]}
    (tmp_path / "b.json").write_text(json.dumps(doc))
    assert read_times(tmp_path / "b.json", "ab") == {"decode": [0.0, 6.0]}
