"""The pure parts under the judge: comparisons, the workload, the state tape."""

from __future__ import annotations

import dataclasses

import math

import ml_dtypes
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kern.judge import compare
from kern.judge.tape import Tape
from kern.drive.script import Bounds, boundaries, feed, make
from kern.manifest.protocol import PageTable, Stepper

LIM = Bounds(vocab=(0, 1000), page_tokens=16, chunk=64, ragged_groups=4, decode_groups=3, context=512,
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
    assert not compare.within(e, compare.Err(4, 4, 0.5, 0))


def test_a_bf16_port_lies_within_the_floor_of_the_reference_in_bf16():
    """The floor is measured: A's values held in B's dtype (rounded to nearest, as a port stores
    them). A port stays within it, a wrong value does not, and there is no floor without a
    measurement."""
    rng = np.random.Generator(np.random.PCG64(0))
    a = rng.standard_normal(1000).astype(np.float32)
    port = compare.region(a, a.astype(ml_dtypes.bfloat16), [(0, 1000)])
    sim = compare.region(a, compare.rounded(a, "bf16", rng), [(0, 1000)])
    assert 0 < port.rel <= sim.rel * compare.FLOOR_FACTOR and compare.within(port, None, sim)
    assert 2 ** -10 < sim.rel <= 2 ** -8  # at most a bf16 unit roundoff of the largest value
    wrong = a.copy()
    wrong[7] *= 3
    assert not compare.within(compare.region(a, wrong.astype(ml_dtypes.bfloat16), [(0, 1000)]), None, sim)
    assert not compare.within(port, None, None)


def test_rounding_in_the_same_dtype_still_measures_a_floor():
    rng = np.random.Generator(np.random.PCG64(1))
    a = rng.standard_normal(1000).astype(np.float32)
    r = compare.rounded(a, "f32", rng)
    assert r.dtype == np.float32 and 0 < compare.region(a, r, [(0, 1000)]).rel < 2 ** -22
    assert np.array_equal(compare.rounded(a, "f32", np.random.Generator(np.random.PCG64(1))),
                          compare.rounded(a, "f32", np.random.Generator(np.random.PCG64(1))))  # seeded
    assert compare.nudged(0.0, rng) == 0.0 and compare.nudged(1e5, rng) in (
        float(np.nextafter(np.float32(1e5), np.float32(np.inf))), float(np.nextafter(np.float32(1e5), np.float32(0))))


def test_within_scales_with_the_larger_measured_floor():
    noise, sim = compare.Err(10, 3, 1e-3, 0), compare.Err(10, 3, 1e-4, 0)
    assert compare.within(compare.Err(10, 5, 15.9e-3, 0), noise, sim)
    assert not compare.within(compare.Err(10, 5, 16.1e-3, 0), noise, sim)
    # integers and state bytes: exact unless A itself (or A in B's precision) differs
    assert not compare.within(compare.Err(10, 1, math.inf, 0), None, None)
    assert compare.within(compare.Err(10, 16, math.inf, 0), compare.Err(10, 1, math.inf, 0), None)


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
    assert r.moved[0] == -2.0 and r.moved[1] == 0.0  # A's gap of +1 became -1 in B


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


def test_a_workload_s_ragged_steps_keep_within_the_prompt_keys_bound():
    """Where the manifest counts the prompt keys a ragged step attends over (Batch.keys), a
    script's chunk of k rows from position at counts at + k; every step stays within the bound
    and every prompt is still fed whole, in order."""
    lim = dataclasses.replace(LIM, keys=100)  # prompts of up to a chunk and two pages: 96
    wl = make(3, lim, seqs=8, decode_steps=2)
    fed = {}
    for step in wl.steps:
        if step.ragged:
            assert sum(c.start + len(c.tokens) for c in step.chunks) <= 100
        for c in step.chunks:
            assert c.start == fed.get(c.seq, 0)
            fed[c.seq] = c.start + len(c.tokens)
    assert all(fed[i] == len(s.prompt) + 2 for i, s in enumerate(wl.seqs))
    assert wl.steps != make(3, LIM, seqs=8, decode_steps=2).steps  # the bound cut some chunk


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


def test_a_buffer_only_the_reference_has_is_held_in_the_candidates_working_dtype():
    """A's normed `h` that B fuses into its LM head's kernel: a faithful bf16 port feeds its
    tensor cores bf16 operands, so A in B's precision rounds `h` to bf16 too (else the logits'
    floor is A's own f32 noise, and every fused bf16 head deviates from it)."""
    from types import SimpleNamespace as NS

    from kern.judge import precision

    def verified(buffers: dict) -> NS:
        return NS(manifest=NS(buffers={n: NS(kind=k, dtype=d) for n, (k, d) in buffers.items()}, states={}))

    a = verified({"x": ("scratch", "f32"), "h": ("scratch", "f32"), "logits": ("scratch", "f32"),
                  "w": ("weight", "f32")})
    b = verified({"x": ("scratch", "bf16"), "logits": ("scratch", "f32"), "w": ("weight", "bf16")})
    p = precision.of(a, b)
    assert p.dtypes == {"x": "bf16", "logits": "f32", "h": "bf16"}
    same = precision.of(a, a)  # a candidate in A's own dtypes: nothing narrower
    assert same.dtypes["h"] == "f32" and "w" not in same.dtypes
