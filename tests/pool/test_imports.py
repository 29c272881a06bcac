"""The pool's modules import one way: no two of them import each other, directly or around a
loop, and none imports the package itself (that loops through __init__). Every import counts,
including ones under TYPE_CHECKING and inside functions (a cycle hidden there is still two
modules that cannot be read, or changed, one without the other). The cycle finder is the
house's (tests/runtime/test_imports.py)."""

from __future__ import annotations

from tests.runtime.test_imports import SRC, cycles, graph

PACKAGE = "kern.pool"


def test_the_pool_has_no_import_cycles():
    g = graph(SRC, SRC / "kern" / "pool")
    assert len(g) > 10 and g[PACKAGE], "the scan found too few modules or imports to mean anything"
    assert cycles(g) == []


def test_the_cycle_finder_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_submodules_do_not_import_the_package():
    """`from kern.pool import X` inside kern.pool would loop through __init__."""
    g = graph(SRC, SRC / "kern" / "pool")
    users = [m for m, deps in g.items() if m != PACKAGE and PACKAGE in deps]
    assert users == []
