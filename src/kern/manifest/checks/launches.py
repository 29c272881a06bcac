"""6. launches: the module exists (or the extern is known, with no geometry); block and grid
fit device limits at the var maxima and are non-zero at the minima; shared memory within the
limit; arity and per-position kinds of extern calls match. Geometry that names the op's scalar
params is checked per call, with the call's values (calls.py)."""

from __future__ import annotations

from collections.abc import Iterator
from math import prod

from ..context import Context
from ..expr import names
from ..limits import CUDA, EXTERNS
from ..schema import Launch
from ..problems import Problem
from ..types import SCALARS, Param

_GEOMETRY = ("grid", "block", "shared_mem", "cooperative", "pdl")


def launches(c: Context) -> Iterator[Problem]:
    for oname, op in c.m.ops.items():
        params = c.params.get(oname)
        if params is None:
            continue
        by_name = {p.name: p for p in params}
        scalars = {p.name: full_range(p) for p in params if p.kind == "scalar"}
        for li, launch in enumerate(op.impl.launches):
            where = f"ops.{oname}.impl.launches[{li}]"
            ext = extern(launch)
            if ext is None:
                if launch.module is None:
                    yield Problem(where, f"entry {launch.entry!r} needs a module")
                elif launch.module not in c.m.modules and c.missing("modules", launch.module):
                    yield Problem(f"{where}.module", f"no module named {launch.module!r}")
                if not uses_params(launch, scalars):
                    yield from geometry(c, where + ".", launch, None)
            else:
                if launch.module is not None:
                    yield Problem(f"{where}.module", "extern entries are library calls and name no module")
                if ext not in EXTERNS:
                    yield Problem(f"{where}.entry", f"unknown extern {ext!r}; known: {', '.join(sorted(EXTERNS))}")
                for key in sorted(launch.model_fields_set & set(_GEOMETRY)):
                    yield Problem(f"{where}.{key}", "extern entries are library calls and have no geometry")
            for key in ("cooperative", "pdl"):
                if getattr(launch, key) and c.device == "cpu":
                    yield Problem(f"{where}.{key}", f"{key} launches need a cuda target")
            args = launch_args(launch, params)
            for ai, a in enumerate(args):
                if isinstance(a, str):
                    if a not in by_name:
                        yield Problem(f"{where}.args[{ai}]", f"no param named {a!r}")
                elif not isinstance(a.value, float):
                    c.bounds(a.value, f"{where}.args[{ai}]", scalars)
            if ext in EXTERNS:
                kinds, _ = EXTERNS[ext]
                if len(args) != len(kinds):
                    yield Problem(f"{where}.args", f"extern {ext} takes {len(kinds)} args, got {len(args)}")
                    continue
                for ai, (want, a) in enumerate(zip(kinds, args)):
                    p = by_name.get(a) if isinstance(a, str) else None
                    got = p.kind if p is not None else "scalar"
                    if got != want:
                        yield Problem(f"{where}.args[{ai}]", f"extern {ext} expects a {want} here, got {got}")


def extern(launch: Launch) -> str | None:
    """The library call an `extern:` entry names, else None."""
    return launch.entry.removeprefix("extern:") if launch.entry.startswith("extern:") else None


def launch_args(launch: Launch, params: list[Param]) -> list:
    """What the launch passes, in order: param names and literal values (default: every param)."""
    return launch.args if launch.args is not None else [p.name for p in params]


def full_range(p: Param) -> tuple[int, int]:
    """The widest range a scalar param can take (f32 scalars do not size anything)."""
    return SCALARS[p.dtype] or (0, 0)


def uses_params(launch: Launch, scalars) -> bool:
    """Whether the launch's geometry depends on the op's scalar params (checked per call)."""
    if not scalars:
        return False
    return any(n in scalars for e in (*launch.grid, *launch.block, launch.shared_mem) for n in names(e))


def geometry(c: Context, where: str, launch: Launch, scalars: dict | None) -> Iterator[Problem]:
    """Grid and block fit the device at the var maxima and are non-zero at the minima; shared
    memory fits. `where` ends in "." (op level) or " " (call level, with the call's scalars)."""
    cuda = c.device == "cuda"
    for key in ("grid", "block"):
        dims = getattr(launch, key)
        if not 1 <= len(dims) <= 3:
            yield Problem(f"{where}{key}", f"needs 1 to 3 dimensions, got {len(dims)}")
            continue
        his: list[int] | None = []
        for i, d in enumerate(dims):
            r = c.bounds(d, f"{where}{key}[{i}]", scalars)
            if r is None:
                his = None
                continue
            if r[0] < 1:
                yield Problem(f"{where}{key}[{i}]", f"is {r[0]} at the var minima; must be >= 1")
            if his is not None:
                his.append(r[1])
            if cuda and r[1] > CUDA[key][i]:
                at = "" if r[0] == r[1] else " at the var maxima"
                yield Problem(f"{where}{key}[{i}]", f"is {r[1]}{at}; the device allows {CUDA[key][i]}")
        if cuda and key == "block" and his and prod(his) > CUDA["threads"]:
            yield Problem(f"{where}block", f"{prod(his)} threads per block; the device allows {CUDA['threads']}")
    r = c.bounds(launch.shared_mem, f"{where}shared_mem", scalars)
    if r is not None and r[0] < 0:
        yield Problem(f"{where}shared_mem", f"is {r[0]} at the var minima; must be >= 0")
    if r is not None and cuda and r[1] > CUDA["shared_mem"]:
        yield Problem(f"{where}shared_mem", f"{r[1]} bytes at the var maxima; the device allows {CUDA['shared_mem']}")
