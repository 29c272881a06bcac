"""kern test on the Kimi-Linear cpu deployment: against itself it PASSes; a bug planted in the
recurrence's gate and one in the state's carry from token to token FAIL, each naming its span."""

from __future__ import annotations

import pytest

from kern.judge.judge import Options, judge
from tests.judge import planted

SMALL = Options(seed=0, seqs=3, decode_steps=2, max_prompt=40)


def _kimi_bug(reps: list[tuple[str, str]], ops: list[str]):
    return lambda base, out: planted.variant(base, out, patch=(reps, ops), of="kimi")


BUGS = {  # name -> (candidate maker, the span its FAIL must name)
    # the decay rate read as A_log itself, its exp forgotten: a gate that forgets too slowly
    "gate": (_kimi_bug([("f[:] = -(_exact(np.exp, a_log)", "f[:] = -(a_log.astype(F32)")], ["kda_gate"]),
             "kda_gate -> kda_gate"),
    # the state carried from a prompt's token to the next without its decay (the cpu deployment's
    # prefill runs the recurrence a token at a time, kda_tokens; the bug left decode's step alone)
    "carry": (_kimi_bug([("S *= _exact(np.exp, g)[..., None]", "S *= F32(1)")], ["kda_chunked"]),
              "kda_chunked -> kda_chunked"),
}


def test_the_reference_against_itself_passes(kimi_dep, kimi_ckpt):
    r = judge(kimi_dep, kimi_dep, kimi_ckpt, SMALL)
    print("\n".join(r.lines + [r.verdict.line]))
    assert (r.verdict.status, r.verdict.kind) == ("PASS", "bit-identical"), r.verdict.line
    assert r.alone and all(x.holds for x in r.alone), [x.line("B") for x in r.alone]  # batch invariance: held


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_planted_bug_fails_and_names_its_span(bug, kimi_dep, kimi_ckpt, tmp_path):
    make, span = BUGS[bug]
    r = judge(kimi_dep, make(kimi_dep, tmp_path / bug), kimi_ckpt, SMALL)
    print("\n".join(r.lines + [r.verdict.line]))
    assert r.verdict.status == "FAIL" and r.verdict.code == 1, r.verdict.line
    assert "failing span " in r.verdict.line and span in r.verdict.line, r.verdict.line
