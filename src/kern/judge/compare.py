"""Comparisons, pure numpy: a buffer on A's write set, bytes written outside it, state bytes,
the candidate's rounding simulated on the reference, and the end-to-end logit rows (KL,
argmax, margin, rank).

The rule for tolerances (docs/kern-test.md): every float comparison happens in f32 (f64 for
logits). A span's error on a buffer is max|b - a| / max|a| over A's write set. Floors are
measured, never fixed: a span is within its floor on a buffer when its error is at most 16 x
the larger of A's own replay error there and the error of A replayed in the candidate's
precision (`rounded`: every float A reads and writes rounded to B's dtype). Integer buffers
are within the floor when no more elements differ than 16 x those two do; states (opaque bytes)
are held to A's own replay alone (facts.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..runtime.dtypes import NP

UNIT_ROUNDOFF = {"f32": 2.0 ** -24, "f16": 2.0 ** -11, "bf16": 2.0 ** -8}
FLOATS = tuple(UNIT_ROUNDOFF)
# How far beyond the measured noise a span may go: a port rounds inside its calls (a fused
# kernel's intermediates, a reduction's partial sums) where the simulation rounds only what each
# call writes, so a faithful one lands a few times above it (a linear whose f32 reduction runs
# in two halves: up to 10 x on SmolLM2-135M, its down projections cancelling).
FLOOR_FACTOR = 16
# End to end, the logits' noise comes from a whole run in B's precision: no rounding hides.
E2E_FACTOR = 4


def rounded(x: np.ndarray, dtype: str, rng: np.random.Generator) -> np.ndarray:
    """x as an implementation in `dtype` would hold it: rounded to nearest in dtype; in x's own
    dtype, where that changes nothing, after a seeded relative jitter of one unit roundoff, so
    that a candidate in A's own dtype gets a measured floor too (a reordered sum rounds
    differently, it does not round less)."""
    t = np.dtype(NP[dtype])
    if x.dtype != t:
        return x.astype(np.float32).astype(t)
    f = x.astype(np.float64)
    f *= 1.0 + UNIT_ROUNDOFF[dtype] * rng.uniform(-1.0, 1.0, f.shape)
    return f.astype(t)


def nudged(value: float, rng: np.random.Generator) -> float:
    """An f32 scalar argument one ulp up or down (seeded): a port may derive its constants with
    one rounding more or less (a rope table's inverse frequencies, say). Zero stays zero: it
    often means "off"."""
    x = np.float32(value)
    if x == 0:
        return 0.0
    return float(np.nextafter(x, np.float32(np.inf) if rng.integers(2) else np.float32(-np.inf)))


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
    wide = (a.view(np.uint64), b.view(np.uint64)) if n % 8 == 0 else (a, b)
    if bool((wide[0] == wide[1]).all()):  # the common case: 8 bytes a comparison, no mask of the state's size
        return Err(n, 0, 0.0, 0)
    wa = a.view(np.uint32) if n % 4 == 0 else a
    wb = b.view(np.uint32) if n % 4 == 0 else b
    differ = int(np.count_nonzero(wa != wb)) * (4 if n % 4 == 0 else 1)
    return Err(n, differ, math.inf if differ else 0.0, 0)


def within(err: Err, *floors: Err | None) -> bool:
    """Is a span's error within its measured floor (A's own replay, A in B's precision)? See
    the module doc for the rule."""
    fs = [f for f in floors if f is not None]
    if err.nonfinite > max((f.nonfinite for f in fs), default=0):
        return False
    if err.differ == 0:
        return True
    if math.isfinite(err.rel):
        return err.rel <= FLOOR_FACTOR * max((f.rel for f in fs if math.isfinite(f.rel)), default=0.0)
    return err.differ <= FLOOR_FACTOR * max((f.differ for f in fs), default=0)


def floor(*floors: Err | None) -> float:
    """The relative error a span may reach on a float buffer (for the facts)."""
    return FLOOR_FACTOR * max((f.rel for f in floors if f is not None and math.isfinite(f.rel)), default=0.0)


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
    moved: np.ndarray  # how far B moved the gap between A's top-1 and top-2 tokens


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
    if fa.shape[-1] > 1:
        two = np.argpartition(fa, -2, axis=-1)[:, -2:]
        first = np.where(two[:, 1] == a_top, two[:, 0], two[:, 1])  # A's second token
    else:
        first = a_top
    at = lambda x, idx: np.take_along_axis(x, idx[:, None], axis=-1)[:, 0]  # noqa: E731
    margin = at(fa, a_top) - at(fa, first)
    moved = (at(fb_safe, a_top) - at(fb_safe, first)) - margin
    rank = (fb_safe > at(fb_safe, a_top)[:, None]).sum(axis=-1)
    return Rows(kl, a_top, b_top, margin, rank, bad, moved)
