"""Lowering: every program to a flat launch list with every argument resolved.

Constants are folded; what depends on a var stays an expression, evaluated per step from the
step's var values. The result is device-independent: each device turns it into its own
runnable form (numpy calls on the CPU, packed kernel params and graphs on CUDA)."""

from __future__ import annotations

from dataclasses import dataclass

from ..manifest.expr import evaluate, names, number
from ..manifest.schema import Add, BufArg, CeilDiv, Expr, Mul, StateArg
from ..manifest.verify import Verified


@dataclass(frozen=True, slots=True)
class View:
    """A buffer, or a window of it: offset (elements) and shape may depend on vars."""

    buffer: str
    dtype: str
    offset: Expr
    shape: tuple[Expr, ...]
    tile: tuple[int, int] | None = None  # read in tensor-map boxes (rows, elements): Launch.tiles


@dataclass(frozen=True, slots=True)
class StateRef:
    state: str


@dataclass(frozen=True, slots=True)
class Scalar:
    dtype: str  # i32 | u32 | i64 | f32
    value: Expr | float  # an int expression over vars, or a folded number

    def at(self, env: dict[str, int]) -> int | float:
        """The value a kernel gets at this env: a float for f32, else an int."""
        v = number(self.value, env)
        return float(v) if self.dtype == "f32" else int(v)


@dataclass(frozen=True, slots=True)
class LoweredLaunch:
    """One launch of a program, device-independent: what may depend on a var is an expression."""

    where: str  # "programs.decode.calls[12] (op rms_norm) launch 0"
    call: int  # index of the call in its program
    module: str | None
    entry: str
    grid: tuple[Expr, ...]
    block: tuple[Expr, ...]
    shared_mem: Expr
    cooperative: bool
    pdl: bool
    args: tuple[View | StateRef | Scalar, ...]
    writes: tuple[int, ...]  # positions in args the launch writes


def fold(e: Expr, consts: dict[str, int]) -> Expr:
    """Fold an expression to an int when it names no var."""
    if any(n not in consts for n in names(e)):
        return e
    return evaluate(e, consts)


def substitute(e: Expr, env: dict[str, Expr]) -> Expr:
    """e with every name in env replaced by its expression."""
    if isinstance(e, str):
        return env.get(e, e)
    if isinstance(e, Mul):
        return Mul(mul=[substitute(x, env) for x in e.mul])
    if isinstance(e, Add):
        return Add(add=[substitute(x, env) for x in e.add])
    if isinstance(e, CeilDiv):
        return CeilDiv(ceil_div=[substitute(x, env) for x in e.ceil_div])
    return e


def lower_program(v: Verified, program: str) -> list[LoweredLaunch]:
    m = v.manifest
    consts = v.constants
    out: list[LoweredLaunch] = []
    for ci, call in enumerate(m.programs[program].calls):
        op = m.ops[call.op]
        params = v.params[call.op]
        bound: dict[str, View | StateRef | Scalar] = {}
        scal_env: dict[str, Expr] = {}
        for p, a in zip(params, call.args):
            if isinstance(a, BufArg):
                b = m.buffers[a.buf]
                shape = a.shape if a.shape is not None else b.shape
                bound[p.name] = View(a.buf, b.dtype, fold(a.offset if a.offset is not None else 0, consts),
                                     tuple(fold(d, consts) for d in shape))
            elif isinstance(a, StateArg):
                bound[p.name] = StateRef(a.state)
            else:
                val = a.value if isinstance(a.value, float) and p.dtype == "f32" else fold(a.value, consts)
                if p.dtype == "f32" and isinstance(val, int):
                    val = float(val)
                bound[p.name] = Scalar(p.dtype, val)
                scal_env[p.name] = val
        by_name = {p.name: p for p in params}
        for li, l in enumerate(op.impl.launches):
            names_ = l.args if l.args is not None else [p.name for p in params]
            args: list[View | StateRef | Scalar] = []
            tiles = l.tiles or {}
            for a in names_:
                if isinstance(a, str) and a in tiles:  # read through a tensor map (this launch only)
                    vw = bound[a]
                    args.append(View(vw.buffer, vw.dtype, vw.offset, vw.shape, (tiles[a][0], tiles[a][1])))
                elif isinstance(a, str):
                    args.append(bound[a])
                else:
                    args.append(Scalar("f32" if isinstance(a.value, float) else "i32", fold(a.value, consts)
                                       if not isinstance(a.value, float) else a.value))
            written = l.writes if l.writes is not None else [n for n in names_ if isinstance(n, str)
                                                              and by_name[n].writes]
            writes = tuple(i for i, n in enumerate(names_) if isinstance(n, str) and n in written)

            def geo(e: Expr) -> Expr:
                # launch geometry may name the op's scalar params: substitute the call's values
                # (ints, or expressions over vars such as `rows` -> `tokens`), then fold
                return fold(substitute(e, {k: x for k, x in scal_env.items() if not isinstance(x, float)}), consts)

            out.append(LoweredLaunch(
                where=f"programs.{program}.calls[{ci}] (op {call.op}) launch {li}", call=ci,
                module=l.module, entry=l.entry, grid=tuple(geo(g) for g in l.grid),
                block=tuple(geo(b) for b in l.block), shared_mem=geo(l.shared_mem),
                cooperative=l.cooperative, pdl=l.pdl, args=tuple(args), writes=writes))
    return out
