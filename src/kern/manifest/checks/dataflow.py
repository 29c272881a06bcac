"""7. op dataflow: a launch writes only through params declared out or inout that it is passed;
every out param is written by some launch; a launch reads in tiles only buffers it is passed and
does not write, in boxes a tensor map can take (1 to 256 rows of at most 128 bytes)."""

from __future__ import annotations

from collections.abc import Iterator

from ..context import Context
from ..limits import EXTERNS
from ..problems import Problem
from ..schema import DTYPE_BYTES
from .launches import extern, launch_args


def dataflow(c: Context) -> Iterator[Problem]:
    for oname, op in c.m.ops.items():
        params = c.params.get(oname)
        if params is None:
            continue
        by_name = {p.name: p for p in params}
        written: set[str] = set()
        for li, launch in enumerate(op.impl.launches):
            where = f"ops.{oname}.impl.launches[{li}]"
            args = launch_args(launch, params)
            ext = extern(launch)
            if ext in EXTERNS:
                default = [args[i] for i in EXTERNS[ext][1] if i < len(args) and isinstance(args[i], str)]
            else:
                default = [a for a in args if isinstance(a, str) and a in by_name and by_name[a].writes]
            for w in launch.writes if launch.writes is not None else default:
                p = by_name.get(w)
                if p is None:
                    yield Problem(f"{where}.writes", f"no param named {w!r}")
                elif not p.writes:
                    yield Problem(f"{where}.writes", f"writes through param {w!r}, declared {p}")
                elif w not in args:
                    yield Problem(f"{where}.writes", f"writes param {w!r} but is not passed it")
                written.add(w)
            for t, box in (launch.tiles or {}).items():
                p = by_name.get(t)
                wrote = launch.writes if launch.writes is not None else default
                if p is None or p.kind != "buffer" or t not in args or t in wrote:
                    yield Problem(f"{where}.tiles.{t}", "reads in tiles only a buffer param it is passed and "
                                  "does not write")
                elif len(box) != 2 or not 1 <= box[0] <= 256 or not 1 <= box[1] * DTYPE_BYTES[p.dtype] <= 128:
                    yield Problem(f"{where}.tiles.{t}", f"box {box}: [rows, elements], 1 to 256 rows of at "
                                  "most 128 bytes")
        for i, p in enumerate(params):
            if p.direction == "out" and p.name not in written:
                yield Problem(f"ops.{oname}.params[{i}]", f"out param {p.name!r} is never written by a launch")
