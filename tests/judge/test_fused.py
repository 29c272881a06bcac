"""kern test between programs that fuse their calls differently (issue 35, item 5): the diff
cuts a changed run where both sides share a boundary, so a planted bug is named by the span of
its layer, not only by the logits. On the CPU: the SmolLM2-135M cpu manifest against a fused
candidate (tests/judge/fused.py); and, diff only, against the sm_90a deployment."""

from __future__ import annotations

from pathlib import Path

import pytest

from kern.judge.diff import diff
from kern.judge.judge import Options, judge
from kern.manifest import load_verified
from tests.judge import fused as fusing

SMALL = Options(seed=0, seqs=3, decode_steps=2, max_prompt=48)
EXAMPLES = Path(__file__).parents[2] / "examples"


@pytest.fixture(scope="module")
def smol_fused(smol_a, tmp_path_factory) -> Path:
    return fusing.fused(smol_a, tmp_path_factory.mktemp("fused") / "b")


def _index(folder: Path, program: str, weight: str) -> int:
    """Where A's program passes a weight: the call a planted bug changes."""
    calls = load_verified(folder).manifest.programs[program].calls
    return next(i for i, c in enumerate(calls) if any(getattr(a, "buf", None) == weight for a in c.args))


def _span_at(line: str, folder: Path, weight: str) -> bool:
    """The verdict's failing span is prefill's span holding A's call that passes `weight`."""
    label = line.split("failing span ")[1].split(" (")[0]
    program, a = label.split(" ")[0], label.split(" ")[1]
    lo, hi = (int(x) for x in a.removeprefix("A[").removesuffix(")").split(":"))
    return program == "prefill" and lo <= _index(folder, "prefill", weight) < hi


def test_every_span_of_a_fused_candidate_replays_in_pieces_of_a_layer(smol_a, smol_fused):
    d = diff(load_verified(smol_a), load_verified(smol_fused))
    assert d.spans and not [s.label for s in d.spans if s.missing]
    layered = [s for s in d.spans if s.program == "decode" and s.a[0] > 0]
    # a layer's ten reference calls meet the candidate's six at five boundaries or more
    assert max(s.a[1] - s.a[0] for s in layered) <= 3 and len(layered) >= 30 * 5
    o = next(s for s in layered if "linear_residual" in s.sb.ops)
    assert o.sa.live_writes == o.sb.live_writes == ("d_x",)  # the residual stream, compared there


def test_the_sm90a_deployment_replays_at_the_boundaries_it_shares_with_the_cpu_one():
    """The GPU build fuses a layer into five calls; against the cpu reference no span is left
    that cannot be replayed, and decode's are half a layer at most (diff only: no GPU here)."""
    d = diff(load_verified(EXAMPLES / "smollm2-135m-instruct-cpu"),
             load_verified(EXAMPLES / "smollm2-135m-instruct-sm90a"))
    assert not [s.label for s in d.spans if s.missing]
    decode = [s for s in d.spans if s.program == "decode"]
    assert max(s.a[1] - s.a[0] for s in decode) <= 5 and len(decode) > 4 * 30


def test_a_faithful_fused_candidate_passes(smol_a, smol_fused, smollm2):
    r = judge(smol_a, smol_fused, smollm2, SMALL)
    assert (r.verdict.status, r.verdict.kind) == ("PASS", "bit-identical"), r.verdict.line


@pytest.mark.parametrize("bug,weight", [("o_proj_swapped", "o_w.3"), ("post_norm_is_pre_norm", "gate_up_w.7")])
def test_a_bug_planted_in_a_fused_candidate_names_its_layers_span(bug, weight, smol_a, smol_fused, smollm2,
                                                                   tmp_path):
    cand = getattr(fusing, bug)(smol_fused, tmp_path / bug)
    r = judge(smol_a, cand, smollm2, SMALL)
    assert r.verdict.status == "FAIL" and "failing span " in r.verdict.line, r.verdict.line
    assert _span_at(r.verdict.line, smol_a, weight), r.verdict.line


def test_a_candidate_without_a_verify_program_is_judged_without_rounds(smol_a, smol_fused, smollm2, tmp_path):
    """A reference that declares a verify program against a candidate that does not (an sm_90a
    build without one): the workload leaves speculative rounds out instead of failing the
    candidate on rows it has no program for."""
    def edit(m):
        m["programs"].pop("verify_round")
        used = {a["buf"] for p in m["programs"].values() for c in p["calls"] for a in c["args"] if "buf" in a}
        m["buffers"] = {n: b for n, b in m["buffers"].items() if n in used}
        ops = {c["op"] for p in m["programs"].values() for c in p["calls"]}
        m["ops"] = {n: op for n, op in m["ops"].items() if n in ops}

    cand = fusing.variant(smol_fused, tmp_path / "no_verify", edit)
    r = judge(smol_a, cand, smollm2, SMALL)
    assert (r.verdict.status, r.verdict.kind) == ("PASS", "bit-identical"), r.verdict.line
