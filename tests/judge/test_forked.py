"""A cpu reference's pieces in forked processes: results come back, failures come back as
errors, the record streams to the children as it is made, and the verdict is the same as in
sequence, line for line."""

from __future__ import annotations

import numpy as np
import pytest

from tests.judge import planted
from kern.judge import blas, candidate, forked
from kern.judge.judge import Options, judge
from kern.judge.record import Live
from kern.judge.tape import Tape


def test_a_forked_part_returns_its_result_and_a_failure_as_an_error():
    assert forked.Part(lambda: np.arange(3).sum(), True).result() == 3
    assert forked.Part(lambda: 7, False).result() == 7

    def fails():
        raise ValueError("no such span")

    with pytest.raises(RuntimeError, match="ValueError: no such span"):
        forked.Part(fails, True).result()


def test_the_record_streams_to_children_as_a_live_recording():
    """Tape deltas and span records reach each child in order; an array two records share is one
    array there too."""
    feed = forked.Feed()

    def child(msgs):
        live = Live(msgs)
        seen = []
        for r in live.records:
            seen.append((r["step"], live.tapes["kv"].reader().at(r["v"]).sum(), id(r["x"])))
        return [s[:2] for s in seen], len({s[2] for s in seen})

    parts = [forked.Part(child, True, feed) for _ in range(2)]
    feed.start()
    tape, shared = Tape(4096), np.ones(1000, np.float32)
    feed.send(("tape", "kv", tape.nbytes))
    for step in range(3):
        tape.snap(np.full(4096, step + 1, np.uint8))
        feed.send(("delta", "kv", *tape.deltas[-1]))
        feed.send(("record", {"step": step, "v": tape.version, "x": shared}))
    feed.close()
    for p in parts:
        assert p.result() == ([(0, 4096), (1, 8192), (2, 12288)], 1)


def test_blas_threads_are_set_inside_and_restored_after():
    if blas._entry() is None:
        pytest.skip("numpy's BLAS here is not OpenBLAS")
    before = blas._entry()[1]()
    with blas.threads(1):
        assert blas._entry()[1]() == 1
    assert blas._entry()[1]() == before


def three_ways(reference, cand, weights, opts, monkeypatch):
    """judge() in sequence, with A's pieces forked, and with B in its own process beside A's
    record as well: each way's lines (less its timings) and verdict, and its report."""
    lines, reports = {}, {}
    for mode, cores, apart in (("sequence", 10**6, False), ("forked", 1, False), ("beside", 1, True)):
        monkeypatch.setattr(forked, "MIN_CORES", cores)
        monkeypatch.setattr(candidate, "apart", lambda a, b, apart=apart: apart)
        r = reports[mode] = judge(reference, cand, weights, opts)
        lines[mode] = [ln for ln in r.lines if not ln.startswith(("time:", "record A:"))] + [r.verdict.line]
    return lines, reports


@pytest.mark.parametrize("bug", ["none", "kv_off_by_one"])
def test_forked_pieces_give_the_verdict_of_the_sequence(bug, smol_a, smollm2, tmp_path, monkeypatch):
    """The bf16 port (a carried KV cache, every span replayed in B's precision), and the same
    with a bug, judged in sequence, with A's pieces forked, and with B in its own process beside
    A's record as well (as a CUDA candidate runs against a cpu reference): the same facts and
    verdict, line for line."""
    cand = planted.bf16(smol_a, tmp_path / "bf16")
    if bug != "none":
        cand = planted.FAILS[bug](cand, tmp_path / bug)
    opts = Options(seed=0, seqs=2, decode_steps=2, max_prompt=20)
    lines, reports = three_ways(smol_a, cand, smollm2, opts, monkeypatch)
    for mode, r in reports.items():
        assert ("wait_b" in r.seconds) == (mode == "beside") and ("wait_a" in r.seconds) == (mode != "sequence")
    assert lines["forked"] == lines["sequence"] and lines["beside"] == lines["sequence"]
    assert lines["sequence"][-1].startswith("FAIL" if bug != "none" else "PASS")


def test_a_candidate_decoding_more_sequences_a_step_is_fed_a_wide_step(smollm2, smol_a, tmp_path, monkeypatch):
    """A reference whose decode takes 4 sequences against the same model decoding up to 32: five
    short sequences of text decode three rows in steps of five, which A runs in slices (4 + 1)
    and B whole; the rows join the evidence, the same in sequence, forked and beside."""
    import json

    from kern_models.llama.generator import generate

    a4 = generate(json.loads((smollm2 / "config.json").read_text()), tmp_path / "a4", target="cpu",
                  model="SmolLM2-135M-Instruct", seqs=4).parent
    opts = Options(seed=0, seqs=2, decode_steps=2, max_prompt=20)
    lines, reports = three_ways(a4, smol_a, smollm2, opts, monkeypatch)
    assert all("wide_b" in r.seconds for r in reports.values())
    assert lines["forked"] == lines["sequence"] and lines["beside"] == lines["sequence"]
    r = reports["beside"]
    wide = next(ln for ln in lines["sequence"] if ln.startswith("wide: "))
    assert "5 sequences of natural-ish text" in wide and "3 decode steps" in wide
    # main: a prefill row, two decode rows and a round of 3 rows each; wide: 1 + 3 + 3
    assert r.facts.e2e.rows == 2 * (1 + 2 + 3) + 5 * (1 + 3 + 3)
    assert r.verdict.status == "PASS"


def test_a_candidate_failing_beside_the_reference_is_a_finding(smol_a, smollm2, tmp_path, monkeypatch):
    """B's own process raising in a kernel: the verdict is B's failure, in one line, as in sequence."""
    cand = planted.variant(smol_a, tmp_path / "b", patch=([("def silu_mul(", "def silu_mul(*a):\n    raise "
                                                            "MemoryError('planted')\n\n\ndef _unused(")],
                                                          ["silu_mul"]))
    opts = Options(seed=0, seqs=2, decode_steps=1, max_prompt=20)
    lines = {}
    for mode, cores, apart in (("sequence", 10**6, False), ("beside", 1, True)):
        monkeypatch.setattr(forked, "MIN_CORES", cores)
        monkeypatch.setattr(candidate, "apart", lambda a, b, apart=apart: apart)
        r = judge(smol_a, cand, smollm2, opts)
        lines[mode] = r.verdict.line
        assert (r.verdict.status, r.verdict.kind) == ("FAIL", "crashed"), r.verdict.line
    assert lines["beside"] == lines["sequence"] and "MemoryError: planted" in lines["sequence"]
