"""One error root: every exception class the engine defines derives from KernError, so a
command that catches KernError catches every error kern reports (src/kern/errors.py)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

from kern.errors import KernError

ENGINE = Path(__file__).resolve().parents[1] / "src" / "kern"
# control flow inside one module, never shown to a user
NOT_REPORTED = {"kern.serve.sse.ClientGone"}


def error_classes(root: Path = ENGINE) -> list[str]:
    """module.Class of each class under root whose name ends in Error, or that derives from
    an Exception named in its bases."""
    out = []
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        for node in ast.parse(path.read_text()).body:
            bases = [ast.unparse(b) for b in getattr(node, "bases", ())]
            if isinstance(node, ast.ClassDef) and any(b.endswith(("Error", "Exception", "Unavailable")) for b in bases):
                out.append(f"{module}.{node.name}")
    return out


def test_every_error_of_the_engine_is_a_kern_error():
    found = error_classes()
    assert len(found) > 20 and "kern.pool.errors.PoolError" in found and "kern.manifest.expr.ExprError" in found
    strays = []
    for name in found:
        if name in NOT_REPORTED or ".hosts.vllm." in name:
            continue
        module, _, cls = name.rpartition(".")
        if not issubclass(getattr(importlib.import_module(module), cls), KernError):
            strays.append(name)
    assert strays == []


def test_the_scan_finds_a_planted_stray(tmp_path):
    pkg = tmp_path / "kern"
    pkg.mkdir()
    (pkg / "a.py").write_text("class Stray(ValueError):\n    pass\n\nclass Fine(KernError):\n    pass\n")
    assert error_classes(pkg) == ["kern.a.Stray", "kern.a.Fine"]
