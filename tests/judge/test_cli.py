"""kern test as a command, on a tiny random checkpoint: facts, the verdict last, exit codes, --json."""

from __future__ import annotations

import json

from tests.judge import planted
from kern.cli import main


def test_pass_prints_facts_then_the_verdict(tiny_a, tiny_ckpt, capsys):
    code = main(["test", "--reference", str(tiny_a), "--candidate", str(tiny_a), "--weights", str(tiny_ckpt)])
    out = capsys.readouterr().out.strip().splitlines()
    assert code == 0 and out[-1].startswith("PASS (bit-identical)")
    assert out[0].startswith("diff: ") and any(l.startswith("workload: ") for l in out)


def test_fail_exit_code_and_json(tiny_a, tiny_ckpt, tmp_path, capsys):
    cand = planted.residual_dropped(tiny_a, tmp_path / "b", layer=0)
    code = main(["test", "--reference", str(tiny_a), "--candidate", str(cand), "--weights", str(tiny_ckpt),
                 "--seed", "3", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1 and doc["verdict"] == "FAIL" and doc["exit"] == 1
    assert any(s["deviates"] and s["ops"] == "add_rms_norm -> rms_norm" for s in doc["spans"])
    assert doc["end_to_end"]["flips"]


def test_candidate_that_does_not_verify_fails(tiny_a, tiny_ckpt, tmp_path, capsys):
    bad = planted.variant(tiny_a, tmp_path / "bad", lambda m: m["buffers"].pop("d_x"))
    code = main(["test", "--reference", str(tiny_a), "--candidate", str(bad), "--weights", str(tiny_ckpt)])
    assert code == 1 and "failed verification" in capsys.readouterr().out


def test_reference_that_does_not_verify_is_inconclusive(tiny_a, tiny_ckpt, tmp_path, capsys):
    bad = planted.variant(tiny_a, tmp_path / "bad", lambda m: m["buffers"].pop("d_x"))
    code = main(["test", "--reference", str(bad), "--candidate", str(tiny_a), "--weights", str(tiny_ckpt)])
    assert code == 2 and capsys.readouterr().out.startswith("INCONCLUSIVE")
