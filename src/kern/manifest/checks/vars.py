"""2. vars have max >= 1 and within limits.MAX_VAR; constants and vars do not collide
(expressions that do not resolve are reported where they stand, through Context.bounds)."""

from __future__ import annotations

from collections.abc import Iterator

from ..context import Context
from ..limits import MAX_VAR
from ..problems import Problem


def vars_and_constants(c: Context) -> Iterator[Problem]:
    for name, var in c.m.vars.items():
        if var.max < 1:
            yield Problem(f"vars.{name}.max", f"must be >= 1, got {var.max}")
        elif var.max > MAX_VAR:
            yield Problem(f"vars.{name}.max", f"must be <= {MAX_VAR} (a var fills a 32-bit scalar), got {var.max}")
        if name in c.m.constants:
            yield Problem(f"vars.{name}", "a constant has the same name")
