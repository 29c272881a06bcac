"""The pool's modules import one way: no two of them import each other, directly or around a
loop. Every import counts, including ones under TYPE_CHECKING and inside functions (a cycle
hidden there is still two modules that cannot be read, or changed, one without the other)."""

from __future__ import annotations

import ast
from pathlib import Path

import kern.pool

PACKAGE = "kern.pool"
ROOT = Path(kern.pool.__file__).parent


def module_name(path: Path) -> str:
    return PACKAGE if path.stem == "__init__" else f"{PACKAGE}.{path.stem}"


def imports(path: Path) -> set[str]:
    """The kern.pool modules `path` imports (`from kern.pool import x` counts as the module
    x when there is one, else as the package)."""
    here = module_name(path)
    names = {module_name(p) for p in ROOT.glob("*.py")}
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from . import x / from .x import y
                base = ".".join([PACKAGE] + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in names else base for a in node.names]
        else:
            continue
        out.update(t for t in targets if t in names and t != here)
    return out


def graph() -> dict[str, set[str]]:
    return {module_name(p): imports(p) for p in sorted(ROOT.glob("*.py"))}


def cycle(g: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of g as a path that ends where it starts, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(g[m]):
            if state.get(n) == 1:
                return path[path.index(n) :] + [n]
            if n not in state and (found := visit(n)):
                return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(g):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_the_pool_has_no_import_cycles():
    g = graph()
    assert len(g) > 10 and g[PACKAGE], "the scan found too few modules or imports to mean anything"
    found = cycle(g)
    assert found is None, "import cycle: " + " -> ".join(found)


def test_the_cycle_finder_finds_cycles():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_submodules_do_not_import_the_package():
    """`from kern.pool import X` inside kern.pool would loop through __init__."""
    g = graph()
    users = [m for m, deps in g.items() if PACKAGE in deps]
    assert users == []
