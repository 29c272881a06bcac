"""What every check needs, computed once: constant values, var bounds, parsed params."""

from __future__ import annotations

from dataclasses import dataclass, field

from .expr import ExprError, evaluate, names, resolve_constants
from .model import Expr, Manifest
from .problems import Problem
from .types import Param, parse_param


@dataclass
class Context:
    m: Manifest
    consts: dict[str, int]
    at_max: dict[str, int]  # constants + every var at its max
    at_min: dict[str, int]  # constants + every var at 1
    params: dict[str, list[Param]]  # op name -> parsed params (ops with malformed params absent)
    problems: list[Problem] = field(default_factory=list)

    def value(self, expr: Expr, where: str, env: dict[str, int] | None = None) -> int | None:
        """Evaluate at the var maxima (or env); on failure record a problem and return None."""
        try:
            return evaluate(expr, self.at_max if env is None else env)
        except ExprError as exc:
            self.problems.append(Problem(where, str(exc)))
            return None

    def bounds(self, expr: Expr, where: str, extra_max=None, extra_min=None) -> tuple[int, int] | None:
        """(value at the var minima, value at the var maxima), or None with a problem."""
        hi = self.value(expr, where, {**self.at_max, **(extra_max or {})})
        if hi is None:
            return None
        lo = evaluate(expr, {**self.at_min, **(extra_min or {})})
        return lo, hi


def build(m: Manifest) -> Context:
    problems: list[Problem] = []
    consts, errors = resolve_constants(m.constants)
    for name, why in errors.items():
        problems.append(Problem(f"constants.{name}", why))
    at_max = dict(consts)
    at_min = dict(consts)
    for name, var in m.vars.items():
        at_max[name] = var.max
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
    ctx = Context(m, consts, at_max, at_min, params, problems)
    return ctx


def expr_names(expr: Expr) -> list[str]:
    return list(names(expr))
