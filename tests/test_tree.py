"""The test and bench trees import by dotted name from the repository root: every folder of
test modules is a package (or pytest would put that folder on sys.path, and its modules would
import their siblings by bare name, found only when some other module had been collected
first), and no test or bench script edits sys.path itself."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_folder_of_test_modules_is_a_package():
    folders = {p.parent for p in (ROOT / "tests").rglob("*.py") if "__pycache__" not in p.parts}
    assert sorted(str(f.relative_to(ROOT)) for f in folders if not (f / "__init__.py").is_file()) == []


def _edits_sys_path(node: ast.AST) -> bool:
    """sys.path.insert(...), .append(...), .extend(...) or sys.path[...] = ... ."""
    def is_sys_path(n: ast.AST) -> bool:
        return (isinstance(n, ast.Attribute) and n.attr == "path" and isinstance(n.value, ast.Name)
                and n.value.id == "sys")
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return node.func.attr in ("insert", "append", "extend") and is_sys_path(node.func.value)
    if isinstance(node, (ast.Assign, ast.AugAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return any(is_sys_path(t) or (isinstance(t, ast.Subscript) and is_sys_path(t.value)) for t in targets)
    return False


def test_no_test_or_bench_script_edits_sys_path():
    found = [f"{p.relative_to(ROOT)}:{node.lineno}"
             for tree in ("tests", "bench") for p in sorted((ROOT / tree).rglob("*.py"))
             if "__pycache__" not in p.parts
             for node in ast.walk(ast.parse(p.read_text())) if _edits_sys_path(node)]
    assert found == []


def test_no_test_or_probe_imports_a_sibling_by_bare_name():
    """A module of tests/ or bench/probes/ imports another of them by its dotted name
    (tests.cuda.cuda_gpu) or relatively, never by its bare name (cuda_gpu), which resolves only
    where some folder is on sys.path: inside functions too (the GPU tests' imports run only on a
    GPU machine, so the CPU suite would never find a bare one)."""
    trees = [ROOT / "tests", ROOT / "bench" / "probes"]
    stems = {p.stem for t in trees for p in t.rglob("*.py") if p.stem != "__init__"}
    found = []
    for t in trees:
        for p in sorted(t.rglob("*.py")):
            if "__pycache__" in p.parts:
                continue
            for node in ast.walk(ast.parse(p.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else []
                found += [f"{p.relative_to(ROOT)}:{node.lineno} {n}" for n in names if n.split(".")[0] in stems]
    assert found == []
