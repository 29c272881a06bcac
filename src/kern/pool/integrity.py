"""The integrity check: every chunk, page, slot and host unit accounted for exactly once,
every holder counted, no unit with two writers. Callable at any time; pure (reads only)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kern.pool.pool import Pool
    from kern.pool.radix import Node


@dataclass(frozen=True, slots=True)
class Problem:
    where: str  # "kv page 12", "lease 7", "chunk 3"
    what: str


class IntegrityError(AssertionError):
    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        lines = [f"  {p.where}: {p.what}" for p in problems[:50]]
        more = [f"  ... and {len(problems) - 50} more"] if len(problems) > 50 else []
        super().__init__("pool integrity check failed:\n" + "\n".join(lines + more))


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def check(pool: Pool) -> list[Problem]:
    out: list[Problem] = []
    _chunks(pool, out)
    _device(pool, out)
    _host(pool, out)
    _tree(pool, out)
    return out


def _chunks(pool: Pool, out: list[Problem]) -> None:
    L = pool.layout
    seen: dict[int, str] = {}
    for c in pool._unmapped:
        if c in seen:
            out.append(Problem(f"chunk {c}", "listed as unmapped twice"))
        seen[c] = "unmapped"
    for b in pool._books:
        for place, c in enumerate(b.vmap):
            if c < 0:
                continue
            where = f"{b.kind.name} place {place}"
            if c in seen:
                out.append(Problem(f"chunk {c}", f"mapped at {where} and also {seen[c]}"))
            seen[c] = where
            if pool._owner.get(c) != (b.kind.index, place):
                out.append(Problem(f"chunk {c}", f"owner table says {pool._owner.get(c)}, books say {where}"))
    for c in range(L.first_dynamic, L.chunks):
        if c not in seen:
            out.append(Problem(f"chunk {c}", "neither mapped nor unmapped (leaked)"))
    for c in seen:
        if not L.first_dynamic <= c < L.chunks:
            out.append(Problem(f"chunk {c}", "is not a dynamic chunk of this pool"))
    pending = sum(sum(b.pending) for b in pool._books)
    if pending != pool._in_flight:
        out.append(Problem("pool", f"{pending} places await a remap, in-flight count says {pool._in_flight}"))


def _units(name: str, b, refs: list[int], lrefs: list[int] | None, out: list[Problem]) -> None:
    pc = b.per_chunk
    free = set()
    for u in b.free:
        if u in free:
            out.append(Problem(f"{name} unit {u}", "free twice"))
        free.add(u)
    cached = 0
    for place, c in enumerate(b.vmap):
        used = 0
        for u in range(place * pc, place * pc + pc):
            r = b.refs[u]
            if r != refs[u]:
                out.append(Problem(f"{name} unit {u}", f"counts {r} holders, {refs[u]} hold it"))
            if lrefs is not None and b.lrefs[u] != lrefs[u]:
                out.append(Problem(f"{name} unit {u}", f"counts {b.lrefs[u]} lease holders, {lrefs[u]} hold it"))
            if r:
                used += 1
                cached += b.lrefs[u] == 0
            if c < 0 or b.pending[place]:
                if r or u in free:
                    out.append(Problem(f"{name} unit {u}", "in use or free in a place with no ready chunk"))
            elif (r == 0) != (u in free):
                out.append(Problem(f"{name} unit {u}", f"{r} holders but {'' if u in free else 'not '}free"))
        if used != b.used[place]:
            out.append(Problem(f"{name} place {place}", f"{used} units in use, books say {b.used[place]}"))
    if cached != b.cached:
        out.append(Problem(name, f"{cached} units held by checkpoints only, books say {b.cached}"))


def _device(pool: Pool, out: list[Problem]) -> None:
    pt = pool._pt
    refs = [[0] * len(b.refs) for b in pool._books]
    lrefs = [[0] * len(b.refs) for b in pool._books]
    reserved = 0
    for lid, lease in pool._leases.items():
        where = f"lease {lid}"
        if not lease.alive or lease.id != lid:
            out.append(Problem(where, "dead or misfiled lease in the live table"))
        n = len(lease.tokens)
        reserved += lease.reserved
        for b in pool._books:
            k = b.kind.index
            us = lease.units[k]
            want = _ceil(n + lease.ahead, pt) if b.kind.paged else 1
            if len(us) != want:
                out.append(Problem(f"{where} {b.kind.name}", f"{len(us)} units for {n} tokens, expected {want}"))
            for u in us:
                refs[k][u] += 1
                lrefs[k][u] += 1
    for ckpt in pool.checkpoints():
        if ckpt.units is None:
            continue
        n = len(ckpt.tokens)
        for b in pool._books:
            k = b.kind.index
            us = ckpt.units[k]
            want = _ceil(n, pt) if b.kind.paged else 1
            if len(us) != want:
                out.append(Problem(f"checkpoint {ckpt.id} {b.kind.name}", f"{len(us)} units for {n} tokens"))
            for u in us:
                refs[k][u] += 1
    for lid, lease in pool._leases.items():  # every unit a lease writes has that one holder
        for b in pool._books:
            us = lease.units[b.kind.index]
            for u in us[len(lease.tokens) // pt :] if b.kind.paged else us:
                r = refs[b.kind.index][u]
                if r != 1:
                    out.append(Problem(f"{b.kind.name} unit {u}", f"written by lease {lid} but held by {r}"))
    for b in pool._books:
        _units(b.kind.name, b, refs[b.kind.index], lrefs[b.kind.index], out)
        want = reserved if b.kind.paged else 0
        if b.reserved != want:
            out.append(Problem(b.kind.name, f"books promise {b.reserved} units, leases hold promises of {want}"))
        if b.avail < 0:
            out.append(Problem(b.kind.name, f"promised {b.reserved} units with {len(b.free)} free"))


def _host(pool: Pool, out: list[Problem]) -> None:
    refs = [[0] * len(hb.refs) for hb in pool._host]
    for ckpt in pool.checkpoints():
        if ckpt.host is None:
            continue
        for k, hs in enumerate(ckpt.host):
            want = len(ckpt.units[k]) if ckpt.units is not None else None
            if want is not None and want != len(hs):
                out.append(Problem(f"checkpoint {ckpt.id}", "host and device copies differ in length"))
            for h in hs:
                refs[k][h] += 1
    for k, hb in enumerate(pool._host):
        name = f"host {hb.kind.name}"
        _units(name, hb, refs[k], None, out)
        for c, o in enumerate(pool._host_owner):
            if (o == k) != (hb.vmap[c] == c):
                out.append(Problem(f"host chunk {c}", f"owner {o}, {name} books disagree"))
        b, dh, hd = pool._books[k], pool._dev_host[k], pool._host_dev[k]
        for u, h in dh.items():
            if u not in hd.get(h, ()):
                out.append(Problem(f"{b.kind.name} unit {u}", f"copy of host unit {h} not listed back"))
            if b.refs[u] == 0 or hb.refs[h] == 0:
                out.append(Problem(f"{b.kind.name} unit {u}", f"copy link to host unit {h} outlived one end"))
        for h, us in hd.items():
            for u in us:
                if dh.get(u) != h:
                    out.append(Problem(f"{name} unit {h}", f"lists device unit {u} that does not link back"))


def _tree(pool: Pool, out: list[Problem]) -> None:
    tree = pool._tree
    count = 0

    def dev(n: Node) -> int:
        return int(n.ckpt is not None and n.ckpt.units is not None)

    below: dict[int, int] = {}
    nodes = tree.nodes()
    for n in reversed(nodes):
        below[n.serial] = sum(below[c.serial] + dev(c) for c in n.children.values())
    for n in nodes:
        where = f"node {n.serial} (depth {n.depth})"
        for key, c in n.children.items():
            if c.parent is not n or not c.edge or c.edge[0] != key or c.depth != n.depth + len(c.edge):
                out.append(Problem(f"node {c.serial}", f"badly linked under {where}"))
        if n.dev_below != below[n.serial]:
            out.append(Problem(where, f"counts {n.dev_below} device checkpoints below, there are {below[n.serial]}"))
        c = n.ckpt
        if c is None:
            if n is not tree.root and len(n.children) < 2:
                out.append(Problem(where, f"no checkpoint and {len(n.children)} children"))
            continue
        count += 1
        if c.node is not n or not c.alive:
            out.append(Problem(where, f"holds {c!r} that is gone or filed elsewhere"))
        if len(c.tokens) != n.depth or tree.path(n) != c.tokens:
            out.append(Problem(where, f"holds {c!r} whose tokens are not the node's path"))
    if count != tree.count:
        out.append(Problem("prefix index", f"{count} checkpoints in the tree, count says {tree.count}"))
