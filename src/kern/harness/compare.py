"""Comparisons, pure numpy: a buffer on A's write set, bytes written outside it, state bytes,
and the end-to-end logit rows (KL, argmax, margin, rank).

The rule for tolerances (docs/kern-test.md): every float comparison happens in f32 (f64 for
logits). A span's error on a buffer is max|b - a| / max|a| over A's write set. It is within
the floor when it is at most max(4 x A's own replay error there, sqrt(u)), u the unit
roundoff of the coarser of the two dtypes (f32 2^-24, f16 2^-11, bf16 2^-8). Integer buffers
and states (opaque bytes) are within the floor when no more bytes differ than 4 x A's own."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

UNIT_ROUNDOFF = {"f32": 2.0 ** -24, "f16": 2.0 ** -11, "bf16": 2.0 ** -8}
FLOATS = tuple(UNIT_ROUNDOFF)


def floor_of(dtype_a: str, dtype_b: str) -> float:
    """sqrt(u) of the coarser float dtype (0 for integers: exact)."""
    us = [UNIT_ROUNDOFF[d] for d in (dtype_a, dtype_b) if d in UNIT_ROUNDOFF]
    return math.sqrt(max(us)) if us else 0.0


def _take(x: np.ndarray, intervals: list[tuple[int, int]]) -> np.ndarray:
    if len(intervals) == 1:
        lo, hi = intervals[0]
        return x[lo:hi]
    return np.concatenate([x[lo:hi] for lo, hi in intervals]) if intervals else x[:0]


def _bits(x: np.ndarray) -> np.ndarray:
    return x.view(np.dtype(f"u{x.dtype.itemsize}"))


@dataclass(frozen=True, slots=True)
class Err:
    """One compared region: elements (or bytes, for states), how many differ, how much."""

    n: int
    differ: int
    rel: float  # max|b-a| / max|a| (floats); 0 or inf for integers and bytes
    nonfinite: int  # B non-finite where A is finite

    @property
    def identical(self) -> bool:
        return self.differ == 0

    def worse(self, o: "Err") -> "Err":
        return Err(max(self.n, o.n), max(self.differ, o.differ), max(self.rel, o.rel), max(self.nonfinite, o.nonfinite))


def region(a: np.ndarray, b: np.ndarray, intervals: list[tuple[int, int]]) -> Err:
    """A's and B's values of one buffer on A's write set (flat prefixes, any dtypes)."""
    xa, xb = _take(a, intervals), _take(b, intervals)
    n = xa.size
    if xb.size != n:
        return Err(n, n, math.inf, 0)
    if xa.dtype == xb.dtype:
        differ = int(np.count_nonzero(_bits(xa) != _bits(xb)))
        if differ == 0:
            return Err(n, 0, 0.0, 0)
    if xa.dtype.kind in "iu" and xb.dtype.kind in "iu":
        differ = int(np.count_nonzero(xa.astype(np.int64) != xb.astype(np.int64)))
        return Err(n, differ, math.inf if differ else 0.0, 0)
    fa, fb = xa.astype(np.float32), xb.astype(np.float32)
    fin_a, fin_b = np.isfinite(fa), np.isfinite(fb)
    nonfinite = int(np.count_nonzero(fin_a & ~fin_b))
    same = (fa == fb) | (~fin_a & ~fin_b & (np.isnan(fa) == np.isnan(fb)))
    differ = int(np.count_nonzero(~same))
    if nonfinite:
        return Err(n, differ, math.inf, nonfinite)
    both = fin_a & fin_b
    d = float(np.max(np.abs(fa[both] - fb[both]), initial=0.0))
    scale = float(np.max(np.abs(fa[both]), initial=0.0))
    rel = 0.0 if d == 0 else (d / scale if scale > 0 else math.inf)
    return Err(n, differ, rel, 0)


def outside(before: np.ndarray, after: np.ndarray, intervals: list[tuple[int, int]]) -> int:
    """Bytes of one buffer a side changed outside A's write set."""
    n = min(before.size, after.size)
    changed = _bits(before[:n]) != _bits(after[:n])
    for lo, hi in intervals:
        changed[lo:min(hi, n)] = False
    return int(np.count_nonzero(changed)) * before.dtype.itemsize


def state_bytes(a: np.ndarray, b: np.ndarray) -> Err:
    """Opaque state bytes (the same prefix of pages on both sides)."""
    n = min(a.size, b.size)
    if a.size != b.size:
        return Err(max(a.size, b.size), max(a.size, b.size), math.inf, 0)
    wa = a.view(np.uint32) if n % 4 == 0 else a
    wb = b.view(np.uint32) if n % 4 == 0 else b
    differ = int(np.count_nonzero(wa != wb)) * (4 if n % 4 == 0 else 1)
    return Err(n, differ, math.inf if differ else 0.0, 0)


def within(err: Err, noise: Err | None, floor: float) -> bool:
    """Is a span's error within the noise floor (see the module doc for the rule)?"""
    if err.nonfinite > (noise.nonfinite if noise else 0):
        return False
    if err.differ == 0:
        return True
    if floor > 0 and math.isfinite(err.rel):
        return err.rel <= max(4 * (noise.rel if noise else 0.0), floor)
    return err.differ <= 4 * (noise.differ if noise else 0)


# ---- end to end ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Rows:
    """Per-row facts of A's and B's logits (same rows, same vocabulary)."""

    kl: np.ndarray  # KL(A || B) in nats
    a_top: np.ndarray
    b_top: np.ndarray
    margin: np.ndarray  # A's top-1 minus top-2 logit
    rank: np.ndarray  # rank of A's top-1 token in B's logits (0 = also B's top)
    b_nonfinite: np.ndarray  # rows where B has a non-finite logit


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def rows(a: np.ndarray, b: np.ndarray) -> Rows:
    fa, fb = a.astype(np.float64), b.astype(np.float64)
    bad = ~np.isfinite(fb).all(axis=-1)
    fb_safe = np.where(np.isfinite(fb), fb, 0.0)
    la, lb = _log_softmax(fa), _log_softmax(fb_safe)
    kl = (np.exp(la) * (la - lb)).sum(axis=-1)
    kl = np.where(bad, np.inf, np.maximum(kl, 0.0))
    a_top, b_top = fa.argmax(axis=-1), fb_safe.argmax(axis=-1)
    top2 = np.partition(fa, -2, axis=-1)[:, -2:] if fa.shape[-1] > 1 else np.concatenate([fa, fa], -1)
    margin = top2[:, 1] - top2[:, 0]
    mine = np.take_along_axis(fb_safe, a_top[:, None], axis=-1)
    rank = (fb_safe > mine).sum(axis=-1)
    return Rows(kl, a_top, b_top, margin, rank, bad)
