"""The pool refuses what is not its own, and a refusal changes nothing.

Every public Pool operation that takes a handle (a lease, a checkpoint, a plan) or arguments
that must agree is called with a handle of another pool, one that has ended (freed, dropped,
or consumed by a checkpoint), or arguments that do not pair up. Each call must raise
PoolError naming the object, and afterwards both pools' books must be exactly as before and
pass the integrity check. The other pool is built by the same steps, so its handles carry the
same ids as this pool's: only identity tells them apart.

The refusals are explicit checks, not asserts, so they hold under `python -O` too; the last
tests hold the pool to that.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

import kern.pool
from kern.pool import Granted, Map, MemoryPlan, Pool, PoolError, Remap, StateDecl

KV = StateDecl("kv", "paged", 16)  # 4-token pages of 64 bytes, 2 to a 128-byte chunk
REC = StateDecl("rec", "per_seq", 20)  # 6 slots to a chunk


def grant(r) -> Granted:
    assert isinstance(r, Granted), r
    return r


def world() -> tuple[Pool, dict]:
    """A busy pool and its handles: a live lease, a freed one, one consumed by a checkpoint,
    a checkpoint on the device, a parked one, a dropped one, a remap acknowledged, and one
    still in flight."""
    p = Pool(16 * 128, [KV, REC], 4, chunk_bytes=128, host_bytes=4 * 128)
    h: dict = {}
    a = h["consumed"] = grant(p.lease([1], 12)).lease
    p.extend(a, [1, 2, 3, 4, 5, 6])
    h["ckpt"] = p.checkpoint(a)
    b = h["live"] = grant(p.lease([1, 2, 3, 4, 5, 6, 7], 12)).lease
    p.extend(b, [7])
    d = h["freed"] = grant(p.lease([5], 8)).lease
    p.extend(d, [5, 5])
    p.free(d)
    e = grant(p.lease([9], 8)).lease
    p.extend(e, [9, 9, 9])
    h["dropped"] = p.checkpoint(e)
    p.drop(h["dropped"])
    f = grant(p.lease([3], 8)).lease
    p.extend(f, [3, 3, 3, 3, 3])
    h["parked"] = p.checkpoint(f)
    assert isinstance(p.park(h["parked"]), MemoryPlan)
    for name in ("done", "remap"):  # fill the slots until a chunk must move to them
        while isinstance(r := p.lease([7], 1), Granted):
            pass
        assert isinstance(r, Remap), r
        h[name] = r.plan
        if name == "done":
            p.remapped(r.plan)
    p.check()
    return p, h


def books(p: Pool) -> tuple:
    """Everything a refusal must leave as it was."""
    leases = [(x.id, list(x.tokens), [list(u) for u in x.units], x.reserved, x.ahead, x.alive) for x in p.leases]
    ckpts = [(c.id, c.tokens, c.units, c.host) for c in p.checkpoints()]
    return p.usage(), leases, ckpts


# (operation, case, call(pool, own handles, other pool's handles), what the message names)
CASES = [
    ("fork", "foreign lease", lambda p, h, f: p.fork(f["live"], 12), lambda h, f: f["live"]),
    ("fork", "freed lease", lambda p, h, f: p.fork(h["freed"], 12), lambda h, f: h["freed"]),
    ("fork", "consumed lease", lambda p, h, f: p.fork(h["consumed"], 12), lambda h, f: h["consumed"]),
    ("fork", "a checkpoint for a lease", lambda p, h, f: p.fork(h["ckpt"], 12), lambda h, f: h["ckpt"]),
    ("fork", "reserve below its tokens", lambda p, h, f: p.fork(h["live"], 2), lambda h, f: h["live"]),
    ("extend", "foreign lease", lambda p, h, f: p.extend(f["live"], [1]), lambda h, f: f["live"]),
    ("extend", "freed lease", lambda p, h, f: p.extend(h["freed"], [1]), lambda h, f: h["freed"]),
    ("extend", "consumed lease", lambda p, h, f: p.extend(h["consumed"], [1]), lambda h, f: h["consumed"]),
    ("extend", "negative ahead", lambda p, h, f: p.extend(h["live"], [1], ahead=-1), lambda h, f: h["live"]),
    ("advance", "foreign lease", lambda p, h, f: p.advance([h["live"], f["live"]], [1, 1]), lambda h, f: f["live"]),
    ("advance", "freed lease", lambda p, h, f: p.advance([h["live"], h["freed"]], [1, 1]), lambda h, f: h["freed"]),
    ("advance", "consumed lease", lambda p, h, f: p.advance([h["consumed"]], [1]), lambda h, f: h["consumed"]),
    ("advance", "more tokens than leases", lambda p, h, f: p.advance([h["live"]], [1, 2]), lambda h, f: "1 leases and 2 tokens"),
    ("advance", "more leases than tokens", lambda p, h, f: p.advance([h["live"], h["live"]], [1]), lambda h, f: "2 leases and 1 tokens"),
    ("advance", "a lease twice", lambda p, h, f: p.advance([h["live"], h["live"]], [1, 1]), lambda h, f: h["live"]),
    ("checkpoint", "foreign lease", lambda p, h, f: p.checkpoint(f["live"]), lambda h, f: f["live"]),
    ("checkpoint", "freed lease", lambda p, h, f: p.checkpoint(h["freed"]), lambda h, f: h["freed"]),
    ("checkpoint", "consumed lease", lambda p, h, f: p.checkpoint(h["consumed"]), lambda h, f: h["consumed"]),
    ("free", "foreign lease", lambda p, h, f: p.free(f["live"]), lambda h, f: f["live"]),
    ("free", "freed lease", lambda p, h, f: p.free(h["freed"]), lambda h, f: h["freed"]),
    ("free", "consumed lease", lambda p, h, f: p.free(h["consumed"]), lambda h, f: h["consumed"]),
    ("park", "foreign checkpoint", lambda p, h, f: p.park(f["ckpt"]), lambda h, f: f["ckpt"]),
    ("park", "foreign parked checkpoint", lambda p, h, f: p.park(f["parked"]), lambda h, f: f["parked"]),
    ("park", "dropped checkpoint", lambda p, h, f: p.park(h["dropped"]), lambda h, f: h["dropped"]),
    ("park", "a lease for a checkpoint", lambda p, h, f: p.park(h["live"]), lambda h, f: h["live"]),
    ("drop", "foreign checkpoint", lambda p, h, f: p.drop(f["ckpt"]), lambda h, f: f["ckpt"]),
    ("drop", "foreign parked checkpoint", lambda p, h, f: p.drop(f["parked"]), lambda h, f: f["parked"]),
    ("drop", "dropped checkpoint", lambda p, h, f: p.drop(h["dropped"]), lambda h, f: h["dropped"]),
    ("drop", "a lease for a checkpoint", lambda p, h, f: p.drop(h["live"]), lambda h, f: h["live"]),
    ("remapped", "plan acknowledged already", lambda p, h, f: p.remapped(h["done"]), lambda h, f: h["done"].maps[0]),
    ("remapped", "plan of no remap", lambda p, h, f: p.remapped(MemoryPlan(maps=(Map(3, "kv", 0),))), lambda h, f: Map(3, "kv", 0)),
    ("remapped", "unknown state", lambda p, h, f: p.remapped(MemoryPlan(maps=(Map(3, "nope", 0),))), lambda h, f: Map(3, "nope", 0)),
    ("remapped", "one good map, one bad", lambda p, h, f: p.remapped(MemoryPlan(maps=h["remap"].maps + (Map(99, "kv", 0),))),
     lambda h, f: Map(99, "kv", 0)),
    ("remapped", "not a plan", lambda p, h, f: p.remapped("plan"), lambda h, f: "'plan'"),
    ("lease", "reserve below the prompt", lambda p, h, f: p.lease([1, 2, 3], 2), lambda h, f: "reserve (2)"),
    ("lease", "negative reserve", lambda p, h, f: p.lease([], -4), lambda h, f: "reserve (-4)"),
]

# Public operations with no handle and no arguments that must agree: nothing to refuse.
NOTHING_TO_REFUSE = {"match", "shared", "evict_one", "clear", "leases", "checkpoints", "usage", "host_traffic", "check"}


@pytest.mark.parametrize("op, case, call, named", CASES, ids=[f"{op}: {case}" for op, case, _, _ in CASES])
def test_a_refused_call_names_the_object_and_changes_nothing(op, case, call, named):
    p, h = world()
    other, f = world()
    before, other_before = books(p), books(other)
    what = named(h, f)
    with pytest.raises(PoolError, match=re.escape(what if isinstance(what, str) else repr(what))):
        call(p, h, f)
    p.check()
    other.check()
    assert books(p) == before
    assert books(other) == other_before


def test_the_table_covers_every_public_operation():
    public = {n for n in dir(Pool) if not n.startswith("_")}
    covered = {op for op, *_ in CASES}
    assert public == covered | NOTHING_TO_REFUSE, sorted(public ^ (covered | NOTHING_TO_REFUSE))


def test_the_pool_has_no_assert_statements():
    """Under `python -O` asserts vanish; a check that matters is an explicit raise."""
    root = Path(kern.pool.__file__).parent
    found = [
        f"{path.name}:{node.lineno}"
        for path in sorted(root.glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Assert)
    ]
    assert found == []


def test_the_refusals_hold_under_python_O():
    """The table again in a `python -O` interpreter, where asserts in src are stripped."""
    out = subprocess.run(
        [sys.executable, "-O", "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k", "refused_call"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert f"{len(CASES)} passed" in out.stdout, out.stdout[-2000:]


@pytest.mark.parametrize("call, named", [
    (lambda lease: lease.page_table("rec"), "no paged state named 'rec'"),
    (lambda lease: lease.page_table("nope"), "no paged state named 'nope'"),
    (lambda lease: lease.slot("kv"), "no per-sequence state named 'kv'"),
])
def test_a_lease_names_the_state_it_does_not_have(call, named):
    p, h = world()
    with pytest.raises(PoolError, match=re.escape(f"{h['live']!r}: the pool has {named}")):
        call(h["live"])
