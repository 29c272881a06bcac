"""A bench workload: a TOML file of shapes to price. Pure.

    samples = 5            # timed samples of each scenario (default 5)
    seed = 0               # the prompt tokens and page order

    [[sweep]]              # one or more; each crosses its lists
    groups = [1, 8]        # sequences stepped together
    rows = [1]             # rows each sequence steps (1 is a decode step)
    context = [0, 512]     # tokens each sequence already holds, built by the model's prefill
    weight = 1.0           # optional: the weight of each of its shapes in totals and kern cut --times
    round = false          # optional: each step is a speculative round, its rows (the last token and
                           # rows - 1 proposed ones) through the manifest's verify program


Every problem is one line naming the file and the field."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from itertools import product

from ..errors import KernError


class WorkloadError(KernError):
    """The workload file is missing, not TOML, or a field is wrong; names the file and field."""


@dataclass(frozen=True, slots=True)
class Shape:
    groups: int
    rows: int  # per group
    context: int  # tokens already held by each sequence
    weight: float
    round: bool = False  # a speculative round through the verify program
    # rows rounded up from a served trace (kern.bench.trace): a step that ran fits its program,
    # so where the rounding passes the prefill program's rows the scenario takes its most
    traced: bool = False

    def label(self) -> str:
        return f"{self.groups}x{self.rows} @ {self.context}" + (" (round)" if self.round else "")


@dataclass(frozen=True, slots=True)
class Workload:
    path: str
    samples: int
    seed: int
    shapes: tuple[Shape, ...]
    sweeps: tuple[dict, ...]

    def to_json(self) -> dict:
        return {"path": self.path, "samples": self.samples, "seed": self.seed, "sweeps": list(self.sweeps)}


TOP = {"samples", "seed", "sweep"}
SWEEP = {"groups", "rows", "context", "weight", "round"}


def _ints(where: str, x: object, lo: int) -> list[int]:
    if isinstance(x, int) and not isinstance(x, bool):
        x = [x]
    if not isinstance(x, list) or not x or not all(isinstance(v, int) and not isinstance(v, bool) for v in x):
        raise WorkloadError(f"{where}: expected a whole number or a non-empty list of them, got {x!r}")
    bad = [v for v in x if v < lo]
    if bad:
        raise WorkloadError(f"{where}: {bad[0]} is below {lo}")
    return list(dict.fromkeys(x))


def parse(text: str, path: str = "workload") -> Workload:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise WorkloadError(f"{path}: not valid TOML ({exc})") from None
    unknown = sorted(set(doc) - TOP)
    if unknown:
        raise WorkloadError(f"{path}: unknown field {unknown[0]!r} (fields: {', '.join(sorted(TOP))})")
    samples = doc.get("samples", 5)
    if not isinstance(samples, int) or isinstance(samples, bool) or samples < 1:
        raise WorkloadError(f"{path}: samples: expected a whole number >= 1, got {samples!r}")
    seed = doc.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise WorkloadError(f"{path}: seed: expected a whole number >= 0, got {seed!r}")
    sweeps = doc.get("sweep")
    if not isinstance(sweeps, list) or not sweeps or not all(isinstance(s, dict) for s in sweeps):
        raise WorkloadError(f"{path}: needs at least one [[sweep]] table (groups, rows, context)")
    shapes: dict[tuple[int, int, int, bool], Shape] = {}
    for i, s in enumerate(sweeps):
        where = f"{path}: sweep[{i}]"
        unknown = sorted(set(s) - SWEEP)
        if unknown:
            raise WorkloadError(f"{where}: unknown field {unknown[0]!r} (fields: {', '.join(sorted(SWEEP))})")
        missing = [k for k in ("groups", "rows", "context") if k not in s]
        if missing:
            raise WorkloadError(f"{where}: missing field {missing[0]!r}")
        weight = s.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0:
            raise WorkloadError(f"{where}.weight: expected a number > 0, got {weight!r}")
        rnd = s.get("round", False)
        if not isinstance(rnd, bool):
            raise WorkloadError(f"{where}.round: expected true or false, got {rnd!r}")
        for g, r, c in product(_ints(f"{where}.groups", s["groups"], 1), _ints(f"{where}.rows", s["rows"], 1),
                               _ints(f"{where}.context", s["context"], 0)):
            shapes.setdefault((g, r, c, rnd), Shape(g, r, c, float(weight), rnd))
    return Workload(path, samples, seed, tuple(shapes.values()), tuple(sweeps))

