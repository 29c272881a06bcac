"""The integrity check must catch a broken pool: each test breaks the books one way."""

from __future__ import annotations

import pytest

from kern.pool import Granted, IntegrityError, Pool, StateDecl, check

KV = StateDecl("kv", "paged", 16)
REC = StateDecl("rec", "per_seq", 20)


def busy_pool() -> tuple[Pool, list]:
    p = Pool(16 * 128, [KV, REC], 4, chunk_bytes=128, host_bytes=4 * 128)
    a = p.lease([1], 12)
    assert isinstance(a, Granted)
    p.extend(a.lease, [1, 2, 3, 4, 5, 6])
    c = p.checkpoint(a.lease)
    b = p.lease([1, 2, 3, 4, 5, 6, 7], 12)
    assert isinstance(b, Granted)
    p.extend(b.lease, [7])
    p.park(c)
    p.check()
    return p, [b.lease]


def wheres(p: Pool) -> str:
    return "\n".join(f"{x.where}: {x.what}" for x in check(p))


def test_a_clean_pool_passes():
    assert check(busy_pool()[0]) == []


def test_a_page_with_two_writers_trips_it():
    p, (b,) = busy_pool()
    kv = b.page_table("kv")
    g = p.lease([9], 12)
    assert isinstance(g, Granted)
    p.extend(g.lease, [9, 9])
    g.lease.page_table("kv")[0] = kv[-1]  # both now write b's last page
    assert "written by lease" in wheres(p)
    with pytest.raises(IntegrityError, match="written by lease"):
        p.check()


def test_a_leaked_page_trips_it():
    p, (b,) = busy_pool()
    b.page_table("kv").pop()  # the lease forgets a page it holds
    out = wheres(p)
    assert "holders" in out and "units for" in out


def test_a_double_free_trips_it():
    p, _ = busy_pool()
    books = p._device.books[0]
    u = books.free[0]
    books.free_at[u // books.per_chunk].append(u)
    assert "free twice" in wheres(p)


def test_a_wrong_free_count_trips_it():
    p, _ = busy_pool()
    p._device.books[0].nfree += 1
    assert "the count says" in wheres(p)


def test_a_lost_chunk_trips_it():
    p, _ = busy_pool()
    p._device.unmapped.append(p.layout.chunks - 1)  # claimed by a state and also unmapped
    assert "mapped at" in wheres(p)


def test_a_wrong_cached_count_trips_it():
    p, _ = busy_pool()
    p._device.books[0].cached += 1  # double counting shared pages
    assert "held by checkpoints only" in wheres(p)


def test_a_stale_host_link_trips_it():
    p, (b,) = busy_pool()
    p._host.dev_host[0][b.page_table("kv")[-1]] = 0
    assert "not listed back" in wheres(p)


def test_a_broken_tree_trips_it():
    p, _ = busy_pool()
    (node,) = [n for n in p._index.tree.nodes() if n.ckpt is not None]
    node.dev_below = 3
    assert "device checkpoints below" in wheres(p)
