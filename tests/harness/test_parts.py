"""The pure parts under the judge: comparisons, the workload, the state tape."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kern.harness import compare
from kern.harness.tape import Tape
from kern.harness.workload import Limits, boundaries, feed, make
from kern.manifest.protocol import PageTable, Stepper

LIM = Limits(vocab=(0, 1000), page_tokens=16, chunk=64, ragged_groups=4, decode_groups=3, context=512,
             table_width=32, pages=200)


def test_region_on_the_write_set_only():
    a = np.arange(10, dtype=np.float32)
    b = a.copy()
    b[8] = 99
    assert compare.region(a, b, [(0, 5)]).identical
    e = compare.region(a, b, [(0, 10)])
    assert e.differ == 1 and math.isclose(e.rel, (99 - 8) / 9)


def test_unwritten_poison_is_nonfinite_and_infinite_error():
    a = np.ones(4, np.float32)
    b = np.array([1, 1, np.nan, 1], np.float32)
    e = compare.region(a, b, [(0, 4)])
    assert e.nonfinite == 1 and math.isinf(e.rel)
    assert not compare.within(e, None, compare.floor_of("f32", "f32"))


def test_cross_dtype_compares_in_f32_with_the_coarser_floor():
    a = np.linspace(-3, 3, 100, dtype=np.float32)
    b = a.astype(ml_dtypes.bfloat16)
    e = compare.region(a, b, [(0, 100)])
    floor = compare.floor_of("f32", "bf16")
    assert floor == 2 ** -4 and 0 < e.rel <= floor and compare.within(e, None, floor)
    assert not compare.within(compare.Err(100, 5, 0.5, 0), None, floor)


def test_within_scales_with_the_noise_floor():
    noise = compare.Err(10, 3, 1e-3, 0)
    assert compare.within(compare.Err(10, 5, 3.9e-3, 0), noise, 2.4e-4)
    assert not compare.within(compare.Err(10, 5, 5e-3, 0), noise, 2.4e-4)
    # integers and state bytes: exact unless A itself differs
    assert not compare.within(compare.Err(10, 1, math.inf, 0), None, 0.0)


def test_outside_counts_bytes_changed_beyond_the_write_set():
    before = np.zeros(8, np.float32)
    after = before.copy()
    after[[1, 6]] = 1
    assert compare.outside(before, after, [(0, 4)]) == 4


def test_rows_kl_margin_rank():
    a = np.array([[0.0, 2.0, 1.0], [5.0, 0.0, 0.0]])
    b = np.array([[0.0, 1.0, 2.0], [5.0, 0.0, 0.0]])
    r = compare.rows(a, b)
    assert r.kl[1] == 0 and r.kl[0] > 0
    assert list(r.a_top) == [1, 0] and list(r.b_top) == [2, 0]
    assert r.margin[0] == 1.0 and list(r.rank) == [1, 0]


def test_workload_lengths_pages_and_steps():
    wl = make(3, LIM, seqs=8, decode_steps=3)
    edges = set(boundaries(LIM).values())
    assert sum(len(s.prompt) in edges for s in wl.seqs) >= 4
    pages = [p for s in wl.seqs for p in s.pages]
    assert sorted(pages) == list(range(wl.pages_used))
    for s in wl.seqs:
        assert all(0 <= t < 1000 for t in s.prompt + s.decode)
        assert len(s.pages) * 16 >= len(s.prompt) + 3
    for step in wl.steps:
        assert step.rows <= (64 if step.ragged else 3) and len(step.chunks) <= (4 if step.ragged else 3)
    fed = {}
    for step in wl.steps:
        for c in step.chunks:
            assert c.start == fed.get(c.seq, 0)
            fed[c.seq] = c.start + len(c.tokens)
    assert all(fed[i] == len(s.prompt) + 3 for i, s in enumerate(wl.seqs))
    assert make(3, LIM, seqs=8, decode_steps=3) == wl and make(4, LIM, seqs=8, decode_steps=3) != wl


def test_feed_fills_roles_and_page_tables():
    wl = make(0, LIM, seqs=3, decode_steps=1)
    st_ = Stepper("prefill", "seqs", 4, None, "tokens", 64, {"token": "ids", "position": "pos", "cu_seqlens": "cu"},
                  {}, (PageTable("pt", "kv", 16),))
    vars, ins = feed(wl.steps[0], st_, wl.seqs, {"pt": 32})
    rows = wl.steps[0].rows
    assert vars == {"seqs": len(wl.steps[0].chunks), "tokens": rows}
    assert ins["ids"].shape == (rows,) and ins["cu"][-1] == rows and ins["pt"].shape == (vars["seqs"], 32)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.lists(st.integers(0, 4095), max_size=5), min_size=1, max_size=6))
def test_tape_versions_read_back(edits):
    tape, states, x = Tape(4096), [], np.zeros(4096, np.uint8)
    for e in edits:
        x[e] = 7 + len(states)
        states.append((tape.snap(x), x.copy()))
    r = tape.reader()
    for v, want in states:
        assert np.array_equal(r.at(v), want)
