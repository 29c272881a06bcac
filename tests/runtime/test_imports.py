"""Imports in kern.runtime run one way (docs/architecture.md, "Layers"): no two of its modules import each
other, directly or round a longer loop, and none imports a floor above it (the host loop, the
judge, the bench, the server, the api, the commands). Every import counts, also those inside
functions (the cuda device is imported lazily, but a loop through it is still a loop)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
RUNTIME = SRC / "kern" / "runtime"
BELOW = ("kern.errors", "kern.manifest", "kern.pool", "kern.runtime")


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, root: Path) -> set[str]:
    """Every kern module `path` imports (relative imports resolved; `from pkg import mod` counts
    as importing pkg.mod when that is a module)."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            mods = {f"{base}.{a.name}" for a in node.names
                    if (root / Path(*f"{base}.{a.name}".split("."))).with_suffix(".py").exists()
                    or (root / Path(*f"{base}.{a.name}".split(".")) / "__init__.py").exists()}
            out |= mods
            if len(mods) < len(node.names):  # a name of the package itself, not only its modules
                out.add(base)
    out.discard(name)  # a module naming itself (pickling under its own name) is no loop
    return {m for m in out if m == "kern" or m.startswith("kern.")}


def graph(root: Path, package: Path) -> dict[str, set[str]]:
    return {module_name(p, root): imports(p, root) for p in sorted(package.rglob("*.py"))}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Every import loop among g's modules, each once, as the path round it."""
    found, state = [], {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for n in sorted(g.get(m, ())):
            if n not in g:
                continue
            if state.get(n) == 1:
                found.append(path[path.index(n):] + [n])
            elif n not in state:
                visit(n, path + [n])
        state[m] = 2

    for m in sorted(g):
        if m not in state:
            visit(m, [m])
    return found


def test_the_runtime_has_no_import_cycles():
    g = graph(SRC, RUNTIME)
    assert len(g) > 15 and "kern.runtime.devices.cuda.device" in g
    assert cycles(g) == []


def test_the_house_has_no_import_cycles():
    """Not only the runtime: no two modules of kern import each other, round any loop (a
    package's __init__ re-exporting its modules counts only where a module imports a name of
    the package itself)."""
    g = graph(SRC, SRC / "kern")
    assert len(g) > 100 and "kern.bench.trace" in g and "kern.commands.run" in g
    assert cycles(g) == []


def test_the_runtime_imports_nothing_above_it():
    up = [f"{m} imports {n}" for m, ns in graph(SRC, RUNTIME).items() for n in sorted(ns)
          if n != "kern" and not n.startswith(BELOW)]
    assert up == []


def test_the_checks_find_a_planted_loop_and_an_upward_import(tmp_path):
    pkg = tmp_path / "kern" / "runtime"
    pkg.mkdir(parents=True)
    (tmp_path / "kern" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .b import x\n")
    (pkg / "b.py").write_text("def f():\n    from kern.runtime import a\n    from kern.api import Model\n")
    g = graph(tmp_path, pkg)
    assert cycles(g) == [["kern.runtime.a", "kern.runtime.b", "kern.runtime.a"]]
    assert "kern.api" in g["kern.runtime.b"]
