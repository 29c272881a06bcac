"""10. topology: ranks within limits.MAX_RANKS, the rank among them, each group a partition of
the ranks (checked by counting, never by listing ranks: the count comes from the manifest).
What the runtime fills in or calls across ranks fits the topology: a peer buffer is a u64
table of one address a rank ([ranks]), and a collective extern needs 2 or more ranks."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from ..context import Context
from ..expr import ExprError, evaluate
from ..limits import COLLECTIVE_EXTERNS, MAX_RANKS
from ..problems import Problem


def topology(c: Context) -> Iterator[Problem]:
    if c.broken.has_field("topology"):
        return
    t = c.m.topology
    if not 1 <= t.ranks <= MAX_RANKS:
        yield Problem("topology.ranks", f"must lie in [1, {MAX_RANKS}], got {t.ranks}")
        return
    if not 0 <= t.rank < t.ranks:
        yield Problem("topology.rank", f"must lie in [0, {t.ranks}), got {t.rank}")
    for g, lists in t.groups.items():
        placed = [r for lst in lists for r in lst]
        outside = sorted({r for r in placed if not 0 <= r < t.ranks})
        twice = sorted(r for r, n in Counter(placed).items() if n > 1)
        if outside or twice or len(placed) != t.ranks:
            why = (f"ranks {outside[:8]} lie outside [0, {t.ranks})" if outside
                   else f"ranks {twice[:8]} are placed twice" if twice
                   else f"{len(placed)} placed, the topology has {t.ranks}")
            yield Problem(f"topology.groups.{g}", f"must place every rank 0..{t.ranks - 1} exactly once: {why}")
        if any(not lst for lst in lists):
            yield Problem(f"topology.groups.{g}", "a rank group cannot be empty")
    yield from _peers(c, t.ranks)
    if t.ranks < 2:
        for oname, op in c.m.ops.items():
            for li, launch in enumerate(op.impl.launches):
                if launch.entry.removeprefix("extern:") in COLLECTIVE_EXTERNS:
                    yield Problem(f"ops.{oname}.impl.launches[{li}].entry",
                                  f"{launch.entry} is a collective: it needs a topology of 2 or more ranks")


def _peers(c: Context, ranks: int) -> Iterator[Problem]:
    """A peer buffer holds one u64 address a rank: the runtime fills it in at load."""
    for name, b in c.m.buffers.items():
        if b.kind != "peer" or ranks < 2:
            continue
        try:
            shape = [evaluate(d, c.consts) for d in b.shape]
        except ExprError:
            shape = None  # names a var or something unresolved: not a table of ranks
        if b.dtype != "u64" or shape != [ranks]:
            yield Problem(f"buffers.{name}", f"a peer buffer is u64 of shape [{ranks}] (one address a rank), "
                          f"got {b.dtype} {[d if isinstance(d, (int, str)) else '...' for d in b.shape]}")
