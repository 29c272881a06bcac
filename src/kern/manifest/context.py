"""What every check needs, computed once: constant values, var ranges, parsed params, and what
schema errors left out (Broken), so checks report nothing that depends on a broken entry."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from .expr import ExprError, interval, names, resolve_constants
from .schema import Call, Expr, Manifest
from .problems import Broken, Problem
from .types import Param, parse_param


@dataclass
class Context:
    m: Manifest
    consts: dict[str, int]
    ranges: dict[str, tuple[int, int]]  # constants (v, v) and every var (1, max)
    at_max: dict[str, int]  # constants + every var at its max
    at_min: dict[str, int]  # constants + every var at 1
    params: dict[str, list[Param]]  # op name -> parsed params (ops with malformed params absent)
    broken: Broken = field(default_factory=Broken)
    unseen: frozenset[str] = frozenset()  # names whose values depend on an entry that did not parse
    problems: list[Problem] = field(default_factory=list)

    @property
    def device(self) -> str | None:
        """The target device; None when the target did not parse (device checks then stay quiet)."""
        return None if self.m.target is None else self.m.target.device

    def missing(self, section: str, name: str) -> bool:
        """Whether naming `name` in `section` is a problem: it is not declared, and not an entry
        that failed to parse."""
        return name not in getattr(self.m, section) and not self.broken.has(section, name)

    def mentioned(self, name: str) -> bool:
        """Whether something that did not parse mentions the name (it may use it)."""
        return name in self.broken.mentions

    def calls(self) -> Iterator[tuple[str, Call]]:
        """Every call that parsed, with its place."""
        bad = self.broken.calls
        for pname, prog in self.m.programs.items():
            for i, call in enumerate(prog.calls):
                if (pname, i) not in bad:
                    yield f"programs.{pname}.calls[{i}] (op {call.op})", call

    def quiet(self, *exprs) -> bool:
        """Whether any of the expressions names something unseen (its problems are not ours)."""
        return bool(self.unseen) and any(n in self.unseen for e in exprs if e is not None for n in names(e))

    def quiet_bounds(self, expr: Expr) -> tuple[int, int] | None:
        try:
            return interval(expr, self.ranges)
        except ExprError:
            return None

    def bounds(self, expr: Expr, where: str, extra: dict[str, tuple[int, int]] | None = None
               ) -> tuple[int, int] | None:
        """(least, greatest) value of expr over the var ranges (and extra ranges, e.g. a launch's
        scalar params); when it does not resolve, record a problem at `where` and return None."""
        try:
            return interval(expr, {**self.ranges, **extra} if extra else self.ranges)
        except ExprError as exc:
            if self.quiet(expr):
                return None
            broken = [n for n in names(expr) if n in self.m.constants and n not in self.consts]
            why = f"constant {broken[0]!r} does not resolve" if broken else str(exc)
            self.problems.append(Problem(where, why))
            return None


def build(m: Manifest, broken: Broken = Broken()) -> Context:
    problems: list[Problem] = []
    unseen = {e.split(".", 1)[1] for e in broken.entries if e.startswith(("constants.", "vars."))}
    consts, errors = resolve_constants(m.constants)
    for name in _dependents(m, unseen):
        unseen.add(name)
    for name, why in errors.items():
        if name not in unseen:
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
    return Context(m, consts, ranges, at_max, at_min, params, broken, frozenset(unseen), problems)


def _dependents(m: Manifest, unseen: set[str]) -> list[str]:
    """Constants that depend, directly or through others, on an unseen name."""
    if not unseen:
        return []
    users: dict[str, list[str]] = {}
    for name, expr in m.constants.items():
        for n in set(names(expr)):
            users.setdefault(n, []).append(name)
    out: list[str] = []
    todo, found = list(unseen), set(unseen)
    while todo:
        for user in users.get(todo.pop(), ()):
            if user not in found:
                found.add(user)
                out.append(user)
                todo.append(user)
    return out
