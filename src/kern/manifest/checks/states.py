"""4. states declare exactly one size, at least one byte, that fits 64 bits, of constants alone
(a state is allocated once, at load: no var has a value then)."""

from __future__ import annotations

from collections.abc import Iterator

from ..context import Context
from ..expr import names
from ..limits import MAX_BYTES
from ..problems import Problem

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
