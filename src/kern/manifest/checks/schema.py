"""1. schema: what pydantic cannot see (version, unknown fields, duplicate names and malformed
type strings are found while parsing: load.py, context.py)."""

from __future__ import annotations

import re
from collections.abc import Iterator

from ..context import Context
from ..problems import Problem

_ARCH = re.compile(r"^sm_[0-9]+[a-z]?$")


def schema(c: Context) -> Iterator[Problem]:
    t = c.m.target
    if t is not None and t.device == "cuda" and (t.arch is None or not _ARCH.match(t.arch)):
        yield Problem("target.arch", f"a cuda target names its architecture like sm_90a, got {t.arch!r}")
    if t is not None and t.device == "cpu" and t.arch is not None:
        yield Problem("target.arch", "a cpu target has no arch")
    for name in c.m.states:
        if name in c.m.buffers:
            yield Problem(f"states.{name}", f"duplicate name {name!r}: a buffer has the same name")
