"""The bench workload file and its scenarios (pure): shapes crossed, dropped with a reason,
context built in prefill chunks."""

from __future__ import annotations

import pytest

from kern.bench.scenario import Scenario, plan
from kern.bench.trace import parse as trace_parse
from kern.bench.workload import Shape, WorkloadError, parse
from kern.drive.engine_io import EngineIO  # noqa: F401  (the limits come from an engine in run.py)
from kern.drive.script import Bounds
from kern.manifest.protocol import derive
from kern.manifest.verify import load_verified

GOOD = """
samples = 3
seed = 7
[[sweep]]
groups = [1, 2]
rows = 1
context = [0, 40]
[[sweep]]
groups = [1]
rows = [8]
context = [40]
weight = 0.25
"""


def test_sweeps_cross_their_lists():
    wl = parse(GOOD)
    assert (wl.samples, wl.seed) == (3, 7)
    assert [(s.groups, s.rows, s.context) for s in wl.shapes] == [
        (1, 1, 0), (1, 1, 40), (2, 1, 0), (2, 1, 40), (1, 8, 40)]
    assert wl.shapes[-1].weight == 0.25 and wl.shapes[0].weight == 1.0


def test_defaults_and_repeated_shapes():
    wl = parse("[[sweep]]\ngroups = [1, 1]\nrows = [1]\ncontext = [0]\n")
    assert (wl.samples, wl.seed, len(wl.shapes)) == (5, 0, 1)


LIM = Bounds(vocab=(0, 256), page_tokens=16, chunk=32, ragged_groups=4, decode_groups=4, context=256,
             table_width=16, pages=20)


@pytest.fixture(scope="module")
def protocol(tiny_a):
    return derive(load_verified(tiny_a))


def test_context_is_built_by_prefill_chunks_then_the_measured_step(protocol):
    sc = plan(Shape(2, 1, 40, 1.0), protocol, LIM, seed=0)
    assert isinstance(sc, Scenario) and sc.program == "decode"
    held = [0, 0]
    for step in sc.prefix:
        assert step.ragged and step.rows <= LIM.chunk
        for c in step.chunks:
            assert c.start == held[c.seq]
            held[c.seq] += len(c.tokens)
    assert held == [40, 40]
    assert [(c.seq, c.start, len(c.tokens)) for c in sc.measured.chunks] == [(0, 40, 1), (1, 40, 1)]
    assert sorted(p for s in sc.seqs for p in s.pages) == list(range(2 * 3))


def test_rows_per_group_above_one_run_the_ragged_program(protocol):
    sc = plan(Shape(1, 8, 0, 1.0), protocol, LIM, seed=0)
    assert sc.program == "prefill" and not sc.prefix and sc.measured.rows == 8


@pytest.mark.parametrize("shape,why", [
    (Shape(100, 1, 0, 1.0), "100 sequences"),
    (Shape(1, 64, 0, 1.0), "64 rows"),
    (Shape(1, 1, 300, 1.0), "positions"),
    (Shape(4, 1, 200, 1.0), "pages"),
])
def test_shapes_no_program_accepts_are_dropped_with_the_reason(protocol, shape, why):
    r = plan(shape, protocol, LIM, seed=0)
    assert isinstance(r, str) and why in r


def test_a_traced_shape_rounded_past_the_prefill_program_takes_its_most_rows(protocol):
    """A served step of 3 sequences of 10 rows ran in the 32-row prefill program; the trace
    rounds it to 3 x 16 = 48 rows, which no program takes. The traced shape is measured at the
    most the program steps for 3 sequences (10 rows each); the same shape written in a workload
    file stays dropped, with the reason."""
    (pre,) = [s for s in protocol.steppers if s.ragged]
    assert pre.rows_max == 32
    wl = trace_parse('{"kern_trace": 1, "model": "m"}\n{"program": "prefill", "rows": [12, 9, 9], "start": [0, 0, 0]}\n')
    (shape,) = wl.shapes
    assert (shape.groups, shape.rows, shape.traced) == (3, 16, True)
    sc = plan(shape, protocol, LIM, seed=0)
    assert isinstance(sc, Scenario) and sc.program == "prefill" and sc.measured.rows == 30
    assert (sc.shape.groups, sc.shape.rows, sc.shape.weight) == (3, 10, 1.0)
    written = plan(Shape(3, 16, 0, 1.0), protocol, LIM, seed=0)
    assert isinstance(written, str) and "no program steps 3 sequences of 16 rows" in written


def test_bad_workload_is_one_error():
    with pytest.raises(WorkloadError, match="sweep"):
        parse("samples = 2\n")
