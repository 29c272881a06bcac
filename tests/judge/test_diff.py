"""The diff: pure, over verified manifests (no weights, no device)."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.judge import planted
from kern.judge.diff import diff, lcs
from kern.manifest import load_verified


def _lcs_len(a, b) -> int:
    t = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i in range(len(a)):
        for j in range(len(b)):
            t[i + 1][j + 1] = t[i][j] + 1 if a[i] == b[j] else max(t[i][j + 1], t[i + 1][j])
    return t[-1][-1]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 4), max_size=14), st.lists(st.integers(0, 4), max_size=14))
def test_lcs_is_a_longest_common_subsequence(a, b):
    pairs = lcs(a, b)
    assert all(a[i] == b[j] for i, j in pairs)
    assert all(i1 < i2 and j1 < j2 for (i1, j1), (i2, j2) in zip(pairs, pairs[1:]))
    assert len(pairs) == _lcs_len(a, b)


def test_identical_manifests_have_no_spans(tiny_a):
    v = load_verified(tiny_a)
    d = diff(v, v)
    assert d.identical and not d.spans
    assert d.summary() == [f"diff: {d.calls_a} calls in A, {d.calls_a} in B; 0 spans; 0 calls removed, 0 added"]


def test_changed_call_is_one_span_with_its_io(tiny_a, tmp_path):
    d = diff(load_verified(tiny_a), load_verified(planted.lm_head_prenorm(tiny_a, tmp_path / "b")))
    by = {s.program: s for s in d.spans}
    assert set(by) == {"prefill", "decode"} and d.calls_added == d.calls_removed == 2
    s = by["decode"]
    assert s.a == (s.b[0], s.b[1]) and s.a[1] - s.a[0] == 1
    assert s.sa.ops == s.sb.ops == ("linear",)
    assert "d_h" in s.sa.reads and "d_x" in s.sb.reads and set(s.inputs) >= {"d_h", "d_x"}
    assert "lm_head" not in s.inputs  # weights are each side's own
    assert s.sa.live_writes == ("d_logits",)


def test_changed_implementation_never_matches(tiny_a, tmp_path):
    d = diff(load_verified(tiny_a), load_verified(planted.kv_off_by_one(tiny_a, tmp_path / "b")))
    assert d.ops_changed == ("kv_append", "kv_append_decode")
    assert len(d.spans) == 2 * 3  # 2 layers x 3 programs (prefill, verify_round: kv_append), one call each
    assert all(s.a[1] - s.a[0] == 1 and s.states == ("kv",) for s in d.spans)


def test_fused_call_replacing_two_is_one_span(tiny_a, tmp_path):
    d = diff(load_verified(planted.split_norm(tiny_a, tmp_path / "a")), load_verified(tiny_a))
    for s in d.spans:
        assert s.a[1] - s.a[0] == 2 and s.b[1] - s.b[0] == 1
        assert s.sa.ops == ("add", "rms_norm") and s.sb.ops == ("add_rms_norm",)
        assert set(s.sa.live_writes) == set(s.sb.live_writes)
    assert d.ops_removed == ("add",)


def test_value_change_in_a_once_program(tiny_a, tmp_path):
    d = diff(load_verified(tiny_a), load_verified(planted.rope_theta(tiny_a, tmp_path / "b")))
    assert [s.label for s in d.spans] == ["rope_init A[0:1) ~ B[0:1)"]


def test_boundary_buffer_absent_on_one_side_is_named(tiny_a, tmp_path):
    def edit(m):
        m["buffers"]["d_x2"] = m["buffers"].pop("d_x")
        for c in m["programs"]["decode"]["calls"]:
            for a in c["args"]:
                if a.get("buf") == "d_x":
                    a["buf"] = "d_x2"
    d = diff(load_verified(tiny_a), load_verified(planted.variant(tiny_a, tmp_path / "b", edit)))
    missing = {m for s in d.spans for m in s.missing}
    assert "buffer 'd_x2' (not in A)" in missing
    assert any("boundary not on both sides" in line for line in d.summary())
