"""The integrity check: every chunk, page, slot and host unit accounted for exactly once,
every holder counted, no unit with two writers, the prefix tree well formed. It recounts from
the holders (leases, checkpoints, host copies) and compares with the books. Pure (reads only);
callable at any time."""

from __future__ import annotations

from kern.pool.admission import DeviceBooks
from kern.pool.errors import Violation
from kern.pool.host import HostTier
from kern.pool.index import PrefixIndex
from kern.pool.leases import Leases
from kern.pool.radix import Node
from kern.pool.states import ceil_div
from kern.pool.units import Books


def check(device: DeviceBooks, host: HostTier, index: PrefixIndex, leases: Leases) -> list[Violation]:
    out: list[Violation] = []
    _chunks(device, out)
    _device(device, index, leases, out)
    _host(device, host, index, out)
    _tree(index, out)
    return out


def _chunks(device: DeviceBooks, out: list[Violation]) -> None:
    L = device.layout
    seen: dict[int, str] = {}
    for c in device.unmapped:
        if c in seen:
            out.append(Violation(f"chunk {c}", "listed as unmapped twice"))
        seen[c] = "unmapped"
    for b in device.books:
        for place, c in enumerate(b.vmap):
            if c < 0:
                continue
            where = f"{b.kind.name} place {place}"
            if c in seen:
                out.append(Violation(f"chunk {c}", f"mapped at {where} and also {seen[c]}"))
            seen[c] = where
            if device.owner.get(c) != (b.kind.index, place):
                out.append(Violation(f"chunk {c}", f"owner table says {device.owner.get(c)}, books say {where}"))
    for c in range(L.first_dynamic, L.chunks):
        if c not in seen:
            out.append(Violation(f"chunk {c}", "neither mapped nor unmapped (leaked)"))
    for c in seen:
        if not L.first_dynamic <= c < L.chunks:
            out.append(Violation(f"chunk {c}", "is not a dynamic chunk of this pool"))
    for b in device.books:
        opened = sum(1 for p, c in enumerate(b.vmap) if c >= 0 and not b.pending[p])
        if opened != b.opened:
            out.append(Violation(f"{b.kind.name} books", f"{opened} places are mapped and ready, the count says "
                                 f"{b.opened}"))
    pending = sum(sum(b.pending) for b in device.books)
    if pending != device.in_flight:
        out.append(Violation("pool", f"{pending} places await a remap, in-flight count says {device.in_flight}"))


def _units(name: str, b: Books, refs: list[int], lrefs: list[int] | None, out: list[Violation]) -> None:
    pc = b.per_chunk
    free = set()
    listed = b.free
    for u in listed:
        if u in free:
            out.append(Violation(f"{name} unit {u}", "free twice"))
        if u // pc >= len(b.free_at) or u not in b.free_at[u // pc]:
            out.append(Violation(f"{name} unit {u}", "free in another place's list"))
        free.add(u)
    if len(listed) != b.nfree:
        out.append(Violation(name, f"{len(listed)} units free, the count says {b.nfree}"))
    cached = 0
    for place, c in enumerate(b.vmap):
        used = 0
        for u in range(place * pc, place * pc + pc):
            r = b.refs[u]
            if r != refs[u]:
                out.append(Violation(f"{name} unit {u}", f"counts {r} holders, {refs[u]} hold it"))
            if lrefs is not None and b.lrefs[u] != lrefs[u]:
                out.append(Violation(f"{name} unit {u}", f"counts {b.lrefs[u]} lease holders, {lrefs[u]} hold it"))
            if r:
                used += 1
                cached += b.lrefs[u] == 0
            if c < 0 or b.pending[place]:
                if r or u in free:
                    out.append(Violation(f"{name} unit {u}", "in use or free in a place with no ready chunk"))
            elif (r == 0) != (u in free):
                out.append(Violation(f"{name} unit {u}", f"{r} holders but {'' if u in free else 'not '}free"))
        if used != b.used[place]:
            out.append(Violation(f"{name} place {place}", f"{used} units in use, books say {b.used[place]}"))
    if cached != b.cached:
        out.append(Violation(name, f"{cached} units held by checkpoints only, books say {b.cached}"))


def _device(device: DeviceBooks, index: PrefixIndex, leases: Leases, out: list[Violation]) -> None:
    pt = device.layout.page_tokens
    books = device.books
    refs = [[0] * len(b.refs) for b in books]
    lrefs = [[0] * len(b.refs) for b in books]
    reserved = 0
    for lid, lease in leases.live.items():
        where = f"lease {lid}"
        if not lease.alive or lease.id != lid:
            out.append(Violation(where, "dead or misfiled lease in the live table"))
        n = len(lease.tokens)
        reserved += lease.reserved
        for b in books:
            k = b.kind.index
            us = lease.units[k]
            want = ceil_div(n + lease.ahead, pt) if b.kind.paged else 1
            if len(us) != want:
                out.append(Violation(f"{where} {b.kind.name}", f"{len(us)} units for {n} tokens, expected {want}"))
            for u in us:
                refs[k][u] += 1
                lrefs[k][u] += 1
    for ckpt in index.checkpoints():
        if ckpt.units is None:
            continue
        n = len(ckpt.tokens)
        for b in books:
            k = b.kind.index
            us = ckpt.units[k]
            want = ceil_div(n, pt) if b.kind.paged else 1
            if len(us) != want:
                out.append(Violation(f"checkpoint {ckpt.id} {b.kind.name}", f"{len(us)} units for {n} tokens"))
            for u in us:
                refs[k][u] += 1
    for lid, lease in leases.live.items():  # every unit a lease writes has that one holder
        for b in books:
            us = lease.units[b.kind.index]
            for u in us[len(lease.tokens) // pt :] if b.kind.paged else us:
                r = refs[b.kind.index][u]
                if r != 1:
                    out.append(Violation(f"{b.kind.name} unit {u}", f"written by lease {lid} but held by {r}"))
    for b in books:
        _units(b.kind.name, b, refs[b.kind.index], lrefs[b.kind.index], out)
        want = reserved if b.kind.paged else 0
        if b.reserved != want:
            out.append(Violation(b.kind.name, f"books promise {b.reserved} units, leases hold promises of {want}"))
        if b.avail < 0:
            out.append(Violation(b.kind.name, f"promised {b.reserved} units with {b.nfree} free"))


def _host(device: DeviceBooks, host: HostTier, index: PrefixIndex, out: list[Violation]) -> None:
    refs = [[0] * len(hb.refs) for hb in host.books]
    for ckpt in index.checkpoints():
        if ckpt.host is None:
            continue
        for k, hs in enumerate(ckpt.host):
            want = len(ckpt.units[k]) if ckpt.units is not None else None
            if want is not None and want != len(hs):
                out.append(Violation(f"checkpoint {ckpt.id}", "host and device copies differ in length"))
            for h in hs:
                refs[k][h] += 1
    for k, hb in enumerate(host.books):
        name = f"host {hb.kind.name}"
        _units(name, hb, refs[k], None, out)
        for c, o in enumerate(host.owner):
            if (o == k) != (hb.vmap[c] == c):
                out.append(Violation(f"host chunk {c}", f"owner {o}, {name} books disagree"))
        b, dh, hd = device.books[k], host.dev_host[k], host.host_dev[k]
        for u, h in dh.items():
            if u not in hd.get(h, ()):
                out.append(Violation(f"{b.kind.name} unit {u}", f"copy of host unit {h} not listed back"))
            if b.refs[u] == 0 or hb.refs[h] == 0:
                out.append(Violation(f"{b.kind.name} unit {u}", f"copy link to host unit {h} outlived one end"))
        for h, us in hd.items():
            for u in us:
                if dh.get(u) != h:
                    out.append(Violation(f"{name} unit {h}", f"lists device unit {u} that does not link back"))


def _tree(index: PrefixIndex, out: list[Violation]) -> None:
    tree = index.tree
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
                out.append(Violation(f"node {c.serial}", f"badly linked under {where}"))
        if n.dev_below != below[n.serial]:
            out.append(Violation(where, f"counts {n.dev_below} device checkpoints below, there are {below[n.serial]}"))
        c = n.ckpt
        if c is None:
            if n is not tree.root and len(n.children) < 2:
                out.append(Violation(where, f"no checkpoint and {len(n.children)} children"))
            continue
        count += 1
        if index.nodes.get(c.id) is not n or not c.alive:
            out.append(Violation(where, f"holds {c!r} that is gone or filed elsewhere"))
        if len(c.tokens) != n.depth or tree.path(n) != c.tokens:
            out.append(Violation(where, f"holds {c!r} whose tokens are not the node's path"))
    if count != tree.count:
        out.append(Violation("prefix index", f"{count} checkpoints in the tree, count says {tree.count}"))
    if count != len(index.nodes):
        out.append(Violation("prefix index", f"{count} checkpoints in the tree, {len(index.nodes)} filed by id"))
