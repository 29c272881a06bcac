"""Integer expressions over named values: literal, name, mul, add, ceil_div."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from ..errors import KernError
from .schema import Add, CeilDiv, Expr, Mul


class ExprError(KernError):
    """An expression does not resolve; the message names the reason."""


LIMIT = 2**128
"""No size, count or offset comes near this; a product past it (say, constants that square each
other 40 times) is refused before its digits eat the verifier's time and memory."""


def _capped(v: int) -> int:
    if -LIMIT <= v <= LIMIT:
        return v
    raise ExprError(f"a product exceeds 2**128 (|value| has {abs(v).bit_length()} bits)")


def names(e: Expr) -> Iterator[str]:
    """Every name an expression refers to."""
    if isinstance(e, str):
        yield e
    elif isinstance(e, Mul):
        for x in e.mul:
            yield from names(x)
    elif isinstance(e, Add):
        for x in e.add:
            yield from names(x)
    elif isinstance(e, CeilDiv):
        yield from names(e.ceil_div[0])
        yield from names(e.ceil_div[1])


def evaluate(e: Expr, env: Mapping[str, int]) -> int:
    """The value of e with names looked up in env; ExprError names what is missing."""
    if isinstance(e, bool):
        raise ExprError(f"{e!r} is not an integer")
    if isinstance(e, int):
        return e
    if isinstance(e, str):
        try:
            return env[e]
        except KeyError:
            raise ExprError(f"unknown name {e!r}") from None
    if isinstance(e, Mul):
        out = 1
        for x in e.mul:
            out = _capped(out * evaluate(x, env))
        return out
    if isinstance(e, Add):
        return sum(evaluate(x, env) for x in e.add)
    if isinstance(e, CeilDiv):
        a, b = evaluate(e.ceil_div[0], env), evaluate(e.ceil_div[1], env)
        if b <= 0:
            raise ExprError(f"ceil_div by {b}")
        return -(-a // b)
    raise ExprError(f"not an expression: {e!r}")


def number(e: Expr | float, env: Mapping[str, int]) -> int | float:
    """A value that is either already a number or still an expression (a lowered argument or
    dimension, folded where it named no var): a float as it is, an int or expression evaluated."""
    return e if isinstance(e, float) else evaluate(e, env)


def interval(e: Expr, env: Mapping[str, tuple[int, int]]) -> tuple[int, int]:
    """Bounds (lo, hi) of e when each name lies anywhere in its range in env (interval
    arithmetic). Exact for expressions that only grow with their names; never too narrow.
    ExprError names an unknown name or a divisor that can be <= 0."""
    if isinstance(e, bool):
        raise ExprError(f"{e!r} is not an integer")
    if isinstance(e, int):
        return e, e
    if isinstance(e, str):
        try:
            return env[e]
        except KeyError:
            raise ExprError(f"unknown name {e!r}") from None
    if isinstance(e, Mul):
        lo = hi = 1
        for x in e.mul:
            a, b = interval(x, env)
            corners = (lo * a, lo * b, hi * a, hi * b)
            lo, hi = _capped(min(corners)), _capped(max(corners))
        return lo, hi
    if isinstance(e, Add):
        lo = hi = 0
        for x in e.add:
            a, b = interval(x, env)
            lo, hi = lo + a, hi + b
        return lo, hi
    if isinstance(e, CeilDiv):
        (a0, a1), (b0, b1) = interval(e.ceil_div[0], env), interval(e.ceil_div[1], env)
        if b0 <= 0:
            raise ExprError(f"ceil_div by {b0}" if b0 == b1 else f"ceil_div by a divisor that can be {b0}")
        corners = [-(-a // b) for a in (a0, a1) for b in (b0, b1)]
        return min(corners), max(corners)
    raise ExprError(f"not an expression: {e!r}")


def resolve_constants(constants: Mapping[str, Expr]) -> tuple[dict[str, int], dict[str, str]]:
    """Values of constants that may refer to each other.

    Returns (values, errors): errors maps a constant to why it does not resolve (an unknown
    name, or a cycle listed in order)."""
    values: dict[str, int] = {}
    errors: dict[str, str] = {}
    state: dict[str, int] = {}  # 1 = visiting, 2 = done

    def visit(name: str, path: list[str]) -> None:
        if state.get(name) == 2:
            return
        if state.get(name) == 1:
            cycle = path[path.index(name):] + [name]
            for n in cycle[:-1]:
                errors.setdefault(n, "constants refer to each other in a cycle: " + " -> ".join(cycle))
            return
        state[name] = 1
        expr = constants[name]
        for dep in names(expr):
            if dep in constants:
                visit(dep, path + [name])
        state[name] = 2
        if name in errors:
            return
        bad = [d for d in names(expr) if d in errors]
        if bad:
            errors[name] = f"depends on constant {bad[0]!r}, which does not resolve"
            return
        try:
            values[name] = evaluate(expr, values)
        except ExprError as exc:
            errors[name] = str(exc)

    for n in constants:
        visit(n, [])
    return values, errors
