"""8. calls match the op signature exactly; var ranges fit scalar types; views (offset, shape)
lie inside their buffer at the var bounds and are aligned; launch geometry that names the op's
scalar params fits with the call's values."""

from __future__ import annotations

from collections.abc import Iterator
from math import prod

from ..context import Context
from ..expr import ExprError, evaluate, names
from ..schema import DTYPE_BYTES, BufArg, StateArg, ValueArg
from ..problems import Problem
from ..types import SCALARS
from .launches import extern, geometry, uses_params


def calls(c: Context) -> Iterator[Problem]:
    m = c.m
    cuda = c.device == "cuda"
    buffers, states, ranges = m.buffers, m.states, c.ranges
    per_call_geometry = {
        oname: [(li, l) for li, l in enumerate(op.impl.launches)
                if extern(l) is None and uses_params(l, {p.name for p in c.params[oname] if p.kind == "scalar"})]
        for oname, op in m.ops.items() if oname in c.params}
    for where, call in c.calls():
        params = c.params.get(call.op)
        if params is None:
            if call.op not in m.ops and c.missing("ops", call.op):
                yield Problem(where, f"no op named {call.op!r}")
            continue
        if len(call.args) != len(params):
            yield Problem(where, f"op takes {len(params)} args ({', '.join(p.name for p in params)}), "
                          f"got {len(call.args)}")
            continue
        scalars: dict[str, tuple[int, int]] = {}
        for i, (p, a) in enumerate(zip(params, call.args)):
            # The hot path formats no place: `where` and the arg index are joined only for a problem.
            kind = p.kind
            if kind == "buffer":
                if type(a) is not BufArg:
                    yield Problem(f"{where} arg {i}", f"expects {p}, got {_argdesc(a)}")
                    continue
                b = buffers.get(a.buf)
                if b is None:
                    if c.missing("buffers", a.buf):
                        yield Problem(f"{where} arg {i}", f"no buffer named {a.buf!r}")
                    continue
                if b.dtype != p.dtype:
                    yield Problem(f"{where} arg {i}", f"expects {p}, got buffer {a.buf!r} of {b.dtype}")
                if a.offset is not None or a.shape is not None:
                    yield from _view(c, f"{where} arg {i}", a, b, cuda)
            elif kind == "state":
                if type(a) is not StateArg:
                    yield Problem(f"{where} arg {i}", f"expects {p}, got {_argdesc(a)}")
                elif a.state not in states and c.missing("states", a.state):
                    yield Problem(f"{where} arg {i}", f"no state named {a.state!r}")
            else:
                if type(a) is not ValueArg:
                    yield Problem(f"{where} arg {i}", f"expects {p}, got {_argdesc(a)}")
                    continue
                v = a.value
                if isinstance(v, float):
                    if p.dtype != "f32":
                        yield Problem(f"{where} arg {i}", f"expects an integer {p.dtype}, got {v!r}")
                    continue
                r = ranges.get(v) if type(v) is str else None
                if r is None:
                    r = c.bounds(v, f"{where} arg {i}")
                if r is None or p.dtype == "f32":
                    continue
                lo, hi = SCALARS[p.dtype]
                if not lo <= r[0] <= hi:
                    yield Problem(f"{where} arg {i}", f"value {r[0]} at the var minima does not fit {p.dtype}")
                if not lo <= r[1] <= hi:
                    yield Problem(f"{where} arg {i}", f"value {r[1]} at the var maxima does not fit {p.dtype}")
                scalars[p.name] = r
        for li, launch in per_call_geometry.get(call.op, ()):
            if all(n in scalars for e in (*launch.grid, *launch.block, launch.shared_mem) for n in names(e)
                   if n in {p.name for p in params}):
                yield from geometry(c, f"{where} launch {li} ", launch, scalars)


def _argdesc(a) -> str:
    if isinstance(a, BufArg):
        return f"buffer {a.buf!r}"
    if isinstance(a, StateArg):
        return f"state {a.state!r}"
    return f"value {a.value!r}"


def _view(c: Context, w: str, a: BufArg, b, cuda: bool) -> Iterator[Problem]:
    """A view [offset, offset + size) lies inside the buffer with every var at 1 and at its max."""
    for env, at in ((c.at_max, "maxima"), (c.at_min, "minima")):
        try:
            total = prod(evaluate(d, env) for d in b.shape)
            off = evaluate(a.offset, env) if a.offset is not None else 0
            size = prod(evaluate(d, env) for d in a.shape) if a.shape is not None else total - off
        except ExprError as exc:
            if not c.quiet(a.offset, *(a.shape or ()), *b.shape):
                yield Problem(w, f"view does not resolve: {exc}")
            return
        if off < 0 or size < 0 or off + size > total:
            yield Problem(w, f"view [{off}, {off + size}) of buffer {a.buf!r} is outside its {total} elements "
                          f"at the var {at}")
            return
        if cuda and (off * DTYPE_BYTES[b.dtype]) % 16:
            yield Problem(w, f"offset {off} of buffer {a.buf!r} is not 16-byte aligned")
            return
