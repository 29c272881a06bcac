"""The candidate's precision, simulated on the reference: the floor of a faithful port.

A bf16 port of an f32 reference can never match its bytes; what it can match is what the
reference itself gives once every value it reads and writes is held in the candidate's dtypes.
So A runs again call by call: before a span, the float buffers it reads are rounded to B's
dtype of the same buffer (`compare.rounded`); after every call, what the call wrote is rounded
the same way; f32 scalar arguments move one ulp. A buffer only A declares (an intermediate that
B fuses away, a norm's output inside B's normed projection) is held in B's working dtype, the
narrowest float dtype of B's own activations: a fused bf16 port feeds its tensor cores bf16
operands, so that rounding is part of a faithful port. The error of that run against A's own
record is the span's measured floor, and the same run end to end gives the logits' floor.

States are opaque bytes, so they cannot be rounded: a state whose declaration differs between
A and B (a KV cache in bf16 against one in f32) is *carried* instead of restored: each side's
replays keep writing it in order, from the rounded inputs, so a span reading it sees what that
side wrote from A's inputs, and it is never compared byte for byte."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from ..drive.engine_io import EngineIO
from ..manifest.verify import Verified
from ..runtime.lower import LoweredLaunch, Scalar
from . import compare


@dataclass(frozen=True, slots=True)
class Precision:
    dtypes: dict[str, str]  # buffer -> B's float dtype, for buffers both sides declare as floats
    carried: frozenset[str]  # states both declare, declared differently: carried, not compared

    def rounds(self, buf: str) -> bool:
        return buf in self.dtypes


def of(v_a: Verified, v_b: Verified) -> Precision:
    ba, bb = v_a.manifest.buffers, v_b.manifest.buffers
    dtypes = {n: bb[n].dtype for n, b in ba.items()
              if n in bb and b.kind != "weight" and b.dtype in compare.FLOATS and bb[n].dtype in compare.FLOATS}
    working = [b.dtype for b in bb.values() if b.kind != "weight" and b.dtype in compare.FLOATS]
    if working:  # A's buffers that B has no name for, in B's working dtype
        narrowest = min(working, key=lambda d: np.dtype(compare.NP[d]).itemsize)
        dtypes |= {n: narrowest for n, b in ba.items()
                   if n not in bb and b.kind != "weight" and b.dtype in compare.FLOATS}
    sa, sb = v_a.manifest.states, v_b.manifest.states
    carried = frozenset(n for n in sa if n in sb and sa[n].model_dump() != sb[n].model_dump())
    return Precision(dtypes, carried)


def _f32(a) -> bool:
    return isinstance(a, Scalar) and a.dtype == "f32" and isinstance(a.value, (int, float))


def _nudge(l: LoweredLaunch, rng: np.random.Generator) -> LoweredLaunch:
    args = tuple(Scalar("f32", compare.nudged(a.value, rng)) if _f32(a) else a for a in l.args)
    return dataclasses.replace(l, args=args)


def round_buffers(io: EngineIO, p: Precision, where: dict[str, list[tuple[int, int]]],
                  rng: np.random.Generator) -> None:
    """Round the given element intervals of each buffer to B's dtype, in place on this side."""
    for buf, ivs in where.items():
        if not p.rounds(buf):
            continue
        for lo, hi in ivs:
            x = io.read(buf, hi)[lo:hi]
            io.write_at(buf, compare.rounded(x, p.dtypes[buf], rng).astype(x.dtype), lo)


def run_rounded(io: EngineIO, p: Precision, program: str, lo: int, hi: int, env: dict[str, int],
                rng: np.random.Generator) -> None:
    """Calls [lo, hi) of a program one by one, each call's float writes rounded to B's dtypes."""
    for c in range(lo, hi):
        ls = io.launches(program, c, c + 1)
        if any(_f32(a) for l in ls for a in l.args):
            ls = [_nudge(l, rng) for l in ls]
            io.run_launches(ls, env)
        else:  # nothing to nudge (and nothing drawn): the call's own lowering, kept between runs
            io.run_calls(program, c, c + 1, env)
        round_buffers(io, p, io.written(ls, env), rng)
