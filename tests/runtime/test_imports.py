"""The house's layering (docs/architecture.md, "Layers"): every module of kern sits in a room,
each room on a floor, and a module imports only from rooms on its own floor or below; no two
modules import each other, directly or round a longer loop. Every import counts, also those
inside functions (the cuda device is imported lazily, but a loop through it is still a loop).
The one import-cycle finder of the tests (tests/pool/test_imports.py uses it too)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

# Bottom to top, as docs/architecture.md draws them. A room is a package of kern or a module
# beside them; `kern` is the package's own __init__ (kern.load, kern.MegaModel).
FLOORS = (
    ("errors",),
    ("manifest", "pool"),
    ("files",),
    ("runtime",),
    ("world", "cut"),
    ("drive", "tokenizer"),
    ("judge", "generation", "deployments"),
    ("speculation",),
    ("serve", "hosts", "api", "mega", "bench"),
    ("commands",),
    ("cli", "kern"),
)
FLOOR = {room: n for n, rooms in enumerate(FLOORS) for room in rooms}


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


def room(module: str) -> str:
    return module.split(".")[1] if "." in module else module


def upward(g: dict[str, set[str]]) -> list[str]:
    """Each import of a room above the importer's floor, and each module in no room."""
    out = [f"{m}: in no room of FLOORS" for m in sorted(g) if room(m) not in FLOOR]
    out += [f"{m} (floor {FLOOR[room(m)]}) imports {n} (floor {FLOOR[room(n)]})"
            for m, ns in sorted(g.items()) for n in sorted(ns)
            if room(m) in FLOOR and room(n) in FLOOR and FLOOR[room(n)] > FLOOR[room(m)]]
    return out


def test_the_house_has_no_import_cycles():
    """No two modules of kern import each other, round any loop (a package's __init__
    re-exporting its modules counts only where a module imports a name of the package itself)."""
    g = graph(SRC, SRC / "kern")
    assert len(g) > 100 and "kern.bench.trace" in g and "kern.runtime.devices.cuda.device" in g
    assert cycles(g) == []


def test_every_room_imports_only_its_floor_and_below():
    g = graph(SRC, SRC / "kern")
    assert {room(m) for m in g} == set(FLOOR), "the rooms of the tree and of FLOORS differ"
    assert upward(g) == []


def test_the_checks_find_a_planted_loop_and_an_upward_import(tmp_path):
    pkg = tmp_path / "kern" / "runtime"
    pkg.mkdir(parents=True)
    (tmp_path / "kern" / "__init__.py").write_text("")
    (tmp_path / "kern" / "api.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .b import x\n")
    (pkg / "b.py").write_text("def f():\n    from kern.runtime import a\n    from kern.api import Model\n")
    (tmp_path / "kern" / "attic.py").write_text("")
    g = graph(tmp_path, tmp_path / "kern")
    assert cycles(g) == [["kern.runtime.a", "kern.runtime.b", "kern.runtime.a"]]
    assert upward(g) == ["kern.attic: in no room of FLOORS",
                         "kern.runtime.b (floor 3) imports kern.api (floor 8)"]
