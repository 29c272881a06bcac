"""The distribution: its name, the `kern` command, the package list and the data it ships."""

from __future__ import annotations

import fnmatch
import importlib
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]


def package_roots() -> dict[str, Path]:
    """Top-level import package -> its folder, from package-dir."""
    dirs = SETUPTOOLS["package-dir"]
    roots = {name: ROOT / path for name, path in dirs.items() if name and "." not in name}
    src = ROOT / dirs[""]
    for init in src.glob("*/__init__.py"):
        roots.setdefault(init.parent.name, init.parent)
    return roots


def test_the_distribution_is_not_named_kern():
    # `kern` on PyPI is an unrelated project and `kern-llm` is the Rust original's bindings.
    assert PYPROJECT["project"]["name"] not in ("kern", "kern-llm")


def test_the_kern_command():
    assert PYPROJECT["project"]["scripts"] == {"kern": "kern.cli:main"}
    assert callable(importlib.import_module("kern.cli").main)


def test_every_package_is_listed_and_every_listed_package_exists():
    found = set()
    for name, folder in package_roots().items():
        for init in folder.rglob("__init__.py"):
            rel = init.parent.relative_to(folder)
            found.add(".".join([name, *rel.parts]))
    listed = set(SETUPTOOLS["packages"])
    assert found - listed == set(), "packages missing from pyproject's [tool.setuptools] packages"
    assert listed - found == set(), "pyproject lists packages that do not exist"


def test_entry_points_resolve():
    for group, entries in PYPROJECT["project"]["entry-points"].items():
        for name, target in entries.items():
            module, _, attr = target.partition(":")
            assert hasattr(importlib.import_module(module), attr), f"{group}.{name} -> {target}"


def test_the_data_generators_read_is_shipped():
    """Every non-Python file in a model package's subfolders, and the CPU kernels the generator
    copies into a deployment, match a package-data glob (or a wheel would lack them)."""
    data = SETUPTOOLS.get("package-data", {})
    roots = package_roots()
    folders = {}
    for pkg in SETUPTOOLS["packages"]:
        top, *rest = pkg.split(".")
        own = SETUPTOOLS["package-dir"].get(pkg)
        folders[pkg] = ROOT / own if own else roots[top].joinpath(*rest)
    models = roots["kern_models"]
    for f in sorted(models.rglob("*")):
        if not f.is_file() or "__pycache__" in f.parts or (f.suffix == ".py" and (f.parent / "__init__.py").exists()):
            continue
        pkg = max((p for p, d in folders.items() if d in f.parents), key=lambda p: len(folders[p].parts))
        rel = f.relative_to(folders[pkg]).as_posix()
        assert any(fnmatch.fnmatch(rel, g) for g in data.get(pkg, [])), f"{pkg}: {rel} is not package data"


def test_kern_serve_needs_nothing_beyond_the_default_install():
    """`pip install -e .` (the README's first command) gives a working `kern serve`: every
    third-party module the server imports comes from a default dependency, not an extra."""
    import ast
    import re
    import sys
    from importlib.metadata import packages_distributions

    imported = set()
    for f in (ROOT / "src" / "kern" / "serve").rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                imported.add(node.module.split(".")[0])
    third_party = imported - set(sys.stdlib_module_names) - {"kern", "kern_models"}

    def norm(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    default = {norm(re.split(r"[<>=!~ \[;]", d, maxsplit=1)[0]) for d in PYPROJECT["project"]["dependencies"]}
    dists = packages_distributions()
    missing = {m for m in third_party if not {norm(d) for d in dists.get(m, [m])} & default}
    assert {"fastapi", "uvicorn"} <= third_party
    assert missing == set(), f"imported by kern.serve, not installed by default: {missing}"
