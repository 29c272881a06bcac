"""4. states declare exactly one size, at least one byte, that fits 64 bits, of constants alone
(a state is allocated once, at load: no var has a value then); a state's host layout (the page
a host allocating it must lay out) is a paged state's, of constant sizes, one `token` axis of
the page tables' stride, and bytes_per_token to the byte."""

from __future__ import annotations

from collections.abc import Iterator
from math import prod

from ..context import Context
from ..expr import names
from ..limits import MAX_BYTES
from ..problems import Problem
from ..schema import DTYPE_BYTES

SIZES = ("bytes_per_token", "bytes_per_seq", "bytes")


def states(c: Context) -> Iterator[Problem]:
    for name, s in c.m.states.items():
        given = [k for k in SIZES if getattr(s, k) is not None]
        if len(given) != 1:
            yield Problem(f"states.{name}", "declare exactly one of bytes_per_token, bytes_per_seq, bytes"
                          + (f"; got {', '.join(given)}" if given else ""))
        for k in given:
            varied = sorted({n for n in names(getattr(s, k)) if n in c.m.vars})
            if varied:
                yield Problem(f"states.{name}.{k}", f"names var {varied[0]}: a state's size is fixed at load, "
                              "of constants alone")
                continue
            r = c.bounds(getattr(s, k), f"states.{name}.{k}")
            if r is None:
                continue
            if r[0] < 1:
                yield Problem(f"states.{name}.{k}", f"must be >= 1 at the var minima, got {r[0]}")
            if r[1] > MAX_BYTES:
                yield Problem(f"states.{name}.{k}", f"{r[1]} bytes at the var maxima overflows a 64-bit size")
        if s.host is not None:
            yield from _host(c, name, s)


def _host(c: Context, name: str, s) -> Iterator[Problem]:
    where = f"states.{name}.host"
    if s.bytes_per_token is None:
        yield Problem(where, "a host layout is a paged state's (bytes_per_token)")
        return
    axes = [a.axis for a in s.host.page]
    if axes.count("token") != 1:
        yield Problem(f"{where}.page", f"needs exactly one axis named 'token', got {axes}")
    dup = sorted({a for a in axes if axes.count(a) > 1})
    if dup:
        yield Problem(f"{where}.page", f"axis {dup[0]!r} appears more than once")
    sizes = {}
    for i, a in enumerate(s.host.page):
        r = c.bounds(a.size, f"{where}.page[{i}] ({a.axis})")
        if r is None:
            return
        if r[0] != r[1] or r[0] < 1:
            yield Problem(f"{where}.page[{i}] ({a.axis})", f"size must be a constant >= 1, got {list(r)}")
            return
        sizes[a.axis] = r[0]
    per_token = c.quiet_bounds(s.bytes_per_token)
    if "token" not in sizes or per_token is None:
        return
    rest = prod(n for a, n in sizes.items() if a != "token") * DTYPE_BYTES[s.host.dtype]
    if per_token[0] != per_token[1] or rest != per_token[0]:
        yield Problem(where, f"a token's axes make {rest} bytes of {s.host.dtype}; bytes_per_token is "
                             f"{per_token[0] if per_token[0] == per_token[1] else list(per_token)}")
    for bname, b in c.m.buffers.items():
        d = b.domain
        if d is None or d.index_into != name or d.stride is None:
            continue
        stride = c.quiet_bounds(d.stride)
        if stride is not None and stride != (sizes["token"], sizes["token"]):
            yield Problem(where, f"the page's token axis is {sizes['token']} tokens; page table "
                                 f"buffers.{bname} strides {stride[1]}")
