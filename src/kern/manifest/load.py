"""Parse manifest bytes into a typed Manifest, or into every problem found."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from .model import Manifest
from .problems import Problem


class _Obj(dict):
    """A JSON object that remembers keys it saw twice."""

    dupes: list[str]


def _pairs(pairs: list[tuple[str, object]]) -> _Obj:
    obj = _Obj()
    obj.dupes = []
    for k, v in pairs:
        if k in obj:
            obj.dupes.append(k)
        obj[k] = v
    return obj


def _duplicates(node: object, where: str) -> list[Problem]:
    out: list[Problem] = []
    if isinstance(node, _Obj):
        for k in node.dupes:
            out.append(Problem(_join(where, k), f"duplicate name {k!r}"))
        for k, v in node.items():
            out.extend(_duplicates(v, _join(where, k)))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out.extend(_duplicates(v, f"{where}[{i}]"))
    return out


def _join(where: str, key: object) -> str:
    if isinstance(key, int):
        return f"{where}[{key}]"
    return f"{where}.{key}" if where else str(key)


def _place(loc: tuple, err_type: str = "") -> str:
    if err_type == "recursion_loop":  # name where the nesting starts, not a path 250 levels deep
        loc = loc[:next((i for i, p in enumerate(loc) if p in _EXPR_TAGS), len(loc))]
    where = ""
    for part in loc:
        # Union tags (e.g. "buf", "mul", "int") are pydantic's bookkeeping, not places.
        if isinstance(part, str) and part in _TAGS:
            continue
        where = _join(where, part)
    return where or "(top level)"


_EXPR_TAGS = {"mul", "add", "ceil_div"}
_TAGS = {"int", "name", "mul", "add", "ceil_div", "buf", "state", "value", "function-after"}


def _describe(err: dict) -> str:
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        return "unknown field"
    if err["type"] == "missing":
        return "missing required field"
    if err["type"] == "recursion_loop":
        return "nested too deeply to read"
    inp = err.get("input")
    if err["type"] not in ("missing",) and not isinstance(inp, (dict, list)):
        msg = f"{msg}, got {inp!r}"
    return msg


def _flag_duplicates(found: list[bool]):
    """A fast object hook that only notes that some object repeats a key."""

    def hook(pairs: list[tuple[str, object]]) -> dict:
        obj = dict(pairs)
        if len(obj) != len(pairs):
            found.append(True)
        return obj

    return hook


def parse(text: str | bytes, where: str = "manifest") -> tuple[Manifest | None, list[Problem]]:
    """Parse JSON text into a Manifest; on failure return every problem with its place."""
    found: list[bool] = []
    try:
        if isinstance(text, bytes):  # a manifest is UTF-8 (json.loads would also guess UTF-16/32)
            text = text.decode("utf-8")
        raw = json.loads(text, object_pairs_hook=_flag_duplicates(found))
    except UnicodeDecodeError as exc:
        return None, [Problem(where, f"not UTF-8 text ({exc.reason} at byte {exc.start})")]
    except json.JSONDecodeError as exc:
        # the text ends before the value does: at its end, or inside a string that never closes
        cut = exc.pos >= len(exc.doc.rstrip()) or exc.msg.startswith("Unterminated string")
        what = "truncated JSON" if cut else "not valid JSON"
        return None, [Problem(where, f"{what}: {exc.msg} at line {exc.lineno} column {exc.colno}")]
    except RecursionError:
        return None, [Problem(where, "not a manifest: JSON nested too deeply to read")]
    except ValueError as exc:  # e.g. an integer literal with more digits than Python converts
        return None, [Problem(where, f"not valid JSON: {str(exc).split(':')[0]}")]
    if not isinstance(raw, dict):
        return None, [Problem(where, f"expected a JSON object at the top level, got {type(raw).__name__}")]
    # Only a manifest that repeats a key pays for a second read that names the places.
    problems = _duplicates(json.loads(text, object_pairs_hook=_pairs), "") if found else []
    try:
        manifest = Manifest.model_validate(raw)
    except ValidationError as exc:
        for err in exc.errors(include_url=False):
            problems.append(Problem(_place(err["loc"], err["type"]), _describe(err)))
        return None, problems
    except RecursionError:
        problems.append(Problem(where, "expressions nested too deeply to read"))
        return None, problems
    return (None if problems else manifest), problems


def read(path: str | Path) -> tuple[Manifest | None, list[Problem]]:
    """Read and parse a manifest file (problems name the file when it cannot be read)."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        return None, [Problem(str(p), f"cannot read: {exc.strerror}")]
    return parse(data, str(p))
