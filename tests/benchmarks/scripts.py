"""A bench/ script loaded into a test, sys.path untouched. Run as `python3 bench/<script>.py`, a
script has bench/ as its sys.path[0] and imports its siblings by bare name (`from shared import
ROOT`); here each sibling it imports (anywhere in its file, a function's lazy import too) is
loaded first from its own file under that bare name, so the script's import statements find it
in sys.modules as they would find it on the path."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _siblings(path: Path) -> list[str]:
    """The bench/ modules the file at path imports by bare name, in the order it names them."""
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names += [a.name for a in node.names]
    return [n for n in dict.fromkeys(names) if "." not in n and (BENCH / f"{n}.py").is_file()]


def load(name: str, module_name: str | None = None) -> ModuleType:
    """bench/<name>.py as the module module_name (its bare name unless given), its siblings first."""
    module_name = module_name or name
    if module_name in sys.modules:
        return sys.modules[module_name]
    path = BENCH / f"{name}.py"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # before its siblings, as an import does: a cycle finds it
    try:
        for sibling in _siblings(path):
            load(sibling)
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]  # as a failed import leaves nothing behind
        raise
    return module
