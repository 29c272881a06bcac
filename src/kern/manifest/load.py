"""Parse manifest bytes into a typed Manifest and every schema problem, each with its place.

A schema problem breaks only the entry it sits in (one buffer, one op, one call of a program,
one top-level field): the rest parses, and `Parsed.broken` says what was left out, so the
verifier still runs every check that does not depend on it. Before typed validation, the raw
JSON is held to what no dependency decides for us: nesting within limits.MAX_DEPTH, finite
numbers only (Python's json reads NaN and Infinity), no name given twice."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field

from pydantic import TypeAdapter, ValidationError

from .limits import MAX_DEPTH
from .schema import Call, Manifest
from .problems import Broken, Problem

SECTIONS = ("constants", "vars", "buffers", "states", "modules", "ops", "programs")
BROKEN_OP = "(did not parse)"  # stands in for a call that did not parse, keeping call indices
_PLACEHOLDER = {"schema_version": 1, "model": "", "target": {"device": "cpu"}}
_EXPR_TAGS = {"mul", "add", "ceil_div"}
_TAGS = {"int", "name", "mul", "add", "ceil_div", "buf", "state", "value", "function-after"}
_CALL = TypeAdapter(Call)


@dataclass
class Parsed:
    manifest: Manifest | None  # None when the text is not a JSON object at all
    problems: list[Problem] = field(default_factory=list)
    broken: Broken = field(default_factory=Broken)


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


def _place(loc: tuple) -> str:
    where = ""
    for part in loc:
        # Union tags (e.g. "buf", "mul", "int") are pydantic's bookkeeping, not places.
        if isinstance(part, str) and part in _TAGS:
            continue
        where = _join(where, part)
    return where or "(top level)"


def _describe(err: dict) -> str:
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        return "unknown field"
    if err["type"] == "missing":
        return "missing required field"
    inp = err.get("input")
    if not isinstance(inp, (dict, list)):
        msg = f"{msg}, got {inp!r}"
    return msg


class _Flags:
    """What the fast JSON hooks noticed, so that only a manifest with such a problem pays for
    the walk that names the places."""

    def __init__(self) -> None:
        self.dupes = self.nonfinite = False

    def pairs(self, pairs: list[tuple[str, object]]) -> dict:
        obj = dict(pairs)
        if len(obj) != len(pairs):
            self.dupes = True
        return obj

    def number(self, text: str) -> float:
        v = float(text)  # "1e999" reads as inf
        if not math.isfinite(v):
            self.nonfinite = True
        return v


_KEEP_ONLY_QUOTES_AND_BRACKETS = bytes(c for c in range(256) if chr(c) not in '"[]{}')
_STRING = re.compile(rb'"[^"]*"')


def _nested_deeper(text: str, limit: int) -> bool:
    """Whether JSON text nests deeper than limit, in a few linear passes in C: drop escaped
    backslashes and quotes, then every byte but quotes and brackets, then strings; peel the
    innermost bracket pairs once per level (at most `limit` passes)."""
    if "\\" in text:
        text = text.replace("\\\\", "").replace('\\"', "")
    s = _STRING.sub(b"", text.encode("utf-8", "surrogatepass").translate(None, _KEEP_ONLY_QUOTES_AND_BRACKETS))
    s = s.replace(b"{", b"[").replace(b"}", b"]")
    for _ in range(limit):
        if not s:
            return False
        s = s.replace(b"[]", b"")
    return bool(s)


def _raw_problems(raw: dict, deep: bool) -> list[tuple[tuple, str]]:
    """(path, what) for nesting past MAX_DEPTH and numbers that are not finite; iterative."""
    out: list[tuple[tuple, str]] = []
    stack: list[tuple[object, tuple]] = [(raw, ())]
    while stack:
        node, path = stack.pop()
        if isinstance(node, float) and not math.isfinite(node):
            written = "NaN" if node != node else "Infinity" if node > 0 else "-Infinity"
            out.append((path, f"{written} is not a number a manifest can hold (numbers are finite)"))
        elif isinstance(node, (dict, list)):
            if deep and len(path) >= MAX_DEPTH:
                cut = next((i for i, k in enumerate(path) if k in _EXPR_TAGS), len(path))
                out.append((path[:cut], "nested too deeply to read"))
                continue
            items = node.items() if isinstance(node, dict) else enumerate(node)
            stack.extend((v, path + (k,)) for k, v in reversed(list(items)))
    return out


def _strings(node: object) -> set[str]:
    out: set[str] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, str):
            out.add(n)
        elif isinstance(n, dict):
            out.update(k for k in n if isinstance(k, str))
            stack.extend(n.values())
        elif isinstance(n, list):
            stack.extend(n)
    return out


def _unit(path: tuple) -> tuple:
    """The entry a raw path lies in: ("buffers", "d_x"), ("programs", "decode", "calls", 3) or
    ("target",)."""
    if path[:1] == ("programs",) and len(path) >= 4 and path[2] == "calls" and isinstance(path[3], int):
        return path[:4]
    if path and path[0] in SECTIONS and len(path) >= 2:
        return path[:2]
    return path[:1]


def _errors(exc: ValidationError, prefix: tuple = ()) -> list[Problem]:
    return [Problem(_place(prefix + tuple(e["loc"])), _describe(e)) for e in exc.errors(include_url=False)]


def _try(data: dict) -> list[Problem]:
    try:
        Manifest.model_validate({**_PLACEHOLDER, **data})
    except ValidationError as exc:
        return _errors(exc)
    return []


def _partial(raw: dict, bad: set[tuple], problems: list[Problem]) -> Parsed:
    """Validate entry by entry; build the Manifest from what parses, placeholders keeping the
    indices of calls that do not."""
    sections = {k: v for k, v in raw.items() if k in SECTIONS and isinstance(v, dict)}
    top = {k: v for k, v in raw.items() if k not in sections and (k,) not in bad}
    for p in _try(top):
        problems.append(p)
        bad.add((p.where.split(".")[0].split("[")[0],))
    for k in ("schema_version", "model", "target"):
        if k not in raw:
            problems.append(Problem(k, "missing required field"))
    good: dict = {k: v for k, v in top.items() if (k,) not in bad}
    for sec, entries in sections.items():
        kept = {}
        for name, value in entries.items():
            if (sec, name) in bad:
                continue
            if sec == "programs" and isinstance(value, dict) and isinstance(value.get("calls"), list):
                calls = []
                for i, call in enumerate(value["calls"]):
                    unit = (sec, name, "calls", i)
                    if unit not in bad:
                        try:
                            _CALL.validate_python(call)
                            calls.append(call)
                            continue
                        except ValidationError as exc:
                            problems.extend(_errors(exc, unit))
                    bad.add(unit)
                    calls.append({"op": BROKEN_OP, "args": []})
                value = {**value, "calls": calls}
            found = _try({sec: {name: value}})
            if found:
                problems.extend(found)
                bad.add((sec, name))
            else:
                kept[name] = value
        good[sec] = kept
    try:
        m = Manifest.model_validate({**_PLACEHOLDER, **good})
    except ValidationError as exc:  # entries that parse alone always parse together
        return Parsed(None, problems + _errors(exc))
    if ("target",) in bad or "target" not in raw:
        m = m.model_copy(update={"target": None})
    mentions: set[str] = set()
    for unit in bad:
        node: object = raw
        for k in unit:
            node = node.get(k) if isinstance(node, dict) else node[k] if isinstance(node, list) else None
        mentions |= _strings(node)
    entries = frozenset(".".join(map(str, u)) for u in bad if len(u) <= 2)
    return Parsed(m, problems, Broken(entries, frozenset((u[1], u[3]) for u in bad if len(u) == 4),
                                      frozenset(mentions)))


def parse_all(text: str | bytes, where: str = "manifest") -> Parsed:
    """Parse JSON text into a Manifest (partial when entries do not parse) and every problem."""
    flags = _Flags()
    try:
        if isinstance(text, bytes):  # a manifest is UTF-8 (json.loads would also guess UTF-16/32)
            text = text.decode("utf-8")
        raw = json.loads(text, object_pairs_hook=flags.pairs, parse_float=flags.number,
                         parse_constant=flags.number)
    except UnicodeDecodeError as exc:
        return Parsed(None, [Problem(where, f"not UTF-8 text ({exc.reason} at byte {exc.start})")])
    except json.JSONDecodeError as exc:
        # the text ends before the value does: at its end, or inside a string that never closes
        cut = exc.pos >= len(exc.doc.rstrip()) or exc.msg.startswith("Unterminated string")
        what = "truncated JSON" if cut else "not valid JSON"
        return Parsed(None, [Problem(where, f"{what}: {exc.msg} at line {exc.lineno} column {exc.colno}")])
    except RecursionError:
        return Parsed(None, [Problem(where, "not a manifest: JSON nested too deeply to read")])
    except ValueError as exc:  # e.g. an integer literal with more digits than Python converts
        return Parsed(None, [Problem(where, f"not valid JSON: {str(exc).split(':')[0]}")])
    if not isinstance(raw, dict):
        return Parsed(None, [Problem(where, f"expected a JSON object at the top level, got {type(raw).__name__}")])
    # Only a manifest that repeats a key pays for a second read that names the places.
    problems = _duplicates(json.loads(text, object_pairs_hook=_pairs), "") if flags.dupes else []
    deep = _nested_deeper(text, MAX_DEPTH)
    bad: set[tuple] = set()
    if deep or flags.nonfinite:
        for path, what in _raw_problems(raw, deep):
            problems.append(Problem(_place(path) if path else where, what))
            bad.add(_unit(path))
    if not bad:
        try:
            return Parsed(Manifest.model_validate(raw), problems)
        except ValidationError:
            pass
    return _partial(raw, bad, problems)


def parse(text: str | bytes, where: str = "manifest") -> tuple[Manifest | None, list[Problem]]:
    """The Manifest only when nothing at all is wrong with the text, and every problem found."""
    p = parse_all(text, where)
    return (None if p.problems else p.manifest), p.problems

