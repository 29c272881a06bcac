"""What every check needs, computed once: constant values, var ranges, parsed params."""

from __future__ import annotations

from dataclasses import dataclass, field

from .expr import ExprError, interval, names, resolve_constants
from .model import Expr, Manifest
from .problems import Problem
from .types import Param, parse_param


@dataclass
class Context:
    m: Manifest
    consts: dict[str, int]
    ranges: dict[str, tuple[int, int]]  # constants (v, v) and every var (1, max)
    at_max: dict[str, int]  # constants + every var at its max
    at_min: dict[str, int]  # constants + every var at 1
    params: dict[str, list[Param]]  # op name -> parsed params (ops with malformed params absent)
    problems: list[Problem] = field(default_factory=list)

    def bounds(self, expr: Expr, where: str, extra: dict[str, tuple[int, int]] | None = None
               ) -> tuple[int, int] | None:
        """(least, greatest) value of expr over the var ranges (and extra ranges, e.g. a launch's
        scalar params); when it does not resolve, record a problem at `where` and return None."""
        try:
            return interval(expr, {**self.ranges, **extra} if extra else self.ranges)
        except ExprError as exc:
            broken = [n for n in names(expr) if n in self.m.constants and n not in self.consts]
            why = f"constant {broken[0]!r} does not resolve" if broken else str(exc)
            self.problems.append(Problem(where, why))
            return None


def build(m: Manifest) -> Context:
    problems: list[Problem] = []
    consts, errors = resolve_constants(m.constants)
    for name, why in errors.items():
        problems.append(Problem(f"constants.{name}", why))
    ranges = {n: (v, v) for n, v in consts.items()}
    at_max = dict(consts)
    at_min = dict(consts)
    for name, var in m.vars.items():
        top = max(var.max, 1)  # a max below 1 is reported once, by the vars check
        ranges[name] = (1, top)
        at_max[name] = top
        at_min[name] = 1
    params: dict[str, list[Param]] = {}
    for oname, op in m.ops.items():
        parsed: list[Param] = []
        ok = True
        for i, text in enumerate(op.params):
            try:
                parsed.append(parse_param(text))
            except ValueError as exc:
                problems.append(Problem(f"ops.{oname}.params[{i}]", str(exc)))
                ok = False
        seen: set[str] = set()
        for i, p in enumerate(parsed):
            if p.name in seen:
                problems.append(Problem(f"ops.{oname}.params[{i}]", f"duplicate param name {p.name!r}"))
                ok = False
            seen.add(p.name)
        if ok:
            params[oname] = parsed
    return Context(m, consts, ranges, at_max, at_min, params, problems)
