"""Targeted behaviours of the pool, each one a claim of the design that can fail."""

from __future__ import annotations

import pytest

from kern.pool import (
    Copy,
    Evict,
    Granted,
    LayoutError,
    Map,
    NeverFits,
    MemoryPlan,
    Pool,
    PoolError,
    Remap,
    StateDecl,
    Unmap,
    Wait,
)

from .executor import CpuExecutor, ExecutorError
from .sim import Sim

KV = StateDecl("kv", "paged", 16)  # 4-token pages of 64 bytes, 2 to a 128-byte chunk
REC = StateDecl("rec", "per_seq", 20)  # 6 slots to a chunk


def pool(chunks=16, states=(KV,), host=0, **kw) -> Pool:
    return Pool(chunks * 128, list(states), 4, chunk_bytes=128, host_bytes=host * 128, **kw)


def grant(r) -> Granted:
    assert isinstance(r, Granted), r
    return r


def test_lease_is_all_or_nothing_and_free_returns_everything():
    p = pool(chunks=4)  # 8 pages
    a = grant(p.lease([1] * 10, 20)).lease  # worst case 5 pages
    assert a.reserved == 5 and a.page_table("kv") == []
    r = p.lease([2] * 10, 16)  # 4 more pages: only 3 left
    assert isinstance(r, Wait), r
    assert p.usage()["kv"]["reserved"] == 5  # the refusal changed nothing
    assert isinstance(p.lease([3] * 10, 33), NeverFits)  # 9 pages > 8 in the pool
    assert p.extend(a, list(range(10))) is None
    assert a.page_table("kv") == [0, 1, 2] and a.reserved == 2
    p.free(a)
    p.check()
    assert p.usage()["kv"] == {"mapped": 8, "free": 8, "reserved": 0, "cached": 0, "held": 0, "host_held": 0}
    with pytest.raises(PoolError, match="not a live lease"):
        p.free(a)


def test_pages_bound_ahead_are_given_back_at_the_checkpoint():
    """A decode run writes several steps before the host knows their tokens: extend(ahead=n)
    binds their pages now; the checkpoint keeps only the pages its tokens use, and the rest go
    back to the reservation and then to the pool."""
    p = pool(chunks=4)  # 8 pages of 4 tokens
    a = grant(p.lease([1] * 5, 20)).lease
    assert p.extend(a, [1] * 5, ahead=6) is None  # 5 + 6 tokens: 3 pages
    assert len(a.page_table("kv")) == 3 and a.reserved == 2 and a.ahead == 6
    p.check()
    assert p.extend(a, [7, 8], ahead=1) is None  # 2 of the 6 kept, a third written
    assert len(a.page_table("kv")) == 2 and a.reserved == 3 and a.ahead == 1  # the third page went back
    p.check()
    ck = p.checkpoint(a)
    assert len(ck.units[0]) == 2 and ck.tokens == (1, 1, 1, 1, 1, 7, 8)
    p.check()
    assert p.usage()["kv"]["reserved"] == 0 and p.usage()["kv"]["held"] == 2
    with pytest.raises(PoolError, match="ahead = -1"):
        p.extend(grant(p.lease([2], 4)).lease, [2], ahead=-1)


def test_extend_past_the_reservation_asks_the_budget():
    p = pool(chunks=2)  # 4 pages
    a = grant(p.lease([1, 2], 4)).lease
    assert p.extend(a, [1, 2, 3, 4]) is None and a.reserved == 0
    assert p.extend(a, [5] * 8) is None  # two more pages: there is room
    assert len(a.page_table("kv")) == 3
    assert isinstance(p.extend(a, [6] * 8), NeverFits)  # 5 pages > 4
    p.check()


def test_checkpoint_shares_whole_pages_and_copies_the_one_the_prefix_ends_in():
    p = pool()
    a = grant(p.lease([9], 10)).lease
    p.extend(a, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10])  # pages 0,1,2 (the last holds 2 tokens)
    ckpt = p.checkpoint(a)
    assert ckpt is not None and ckpt.units == ((0, 1, 2),)
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]  # cached: all 10 (prompt minus last token)
    assert p.match(prompt).tokens == 10 and p.match(prompt).checkpoint is ckpt
    g = grant(p.lease(prompt, 16))
    assert g.cached == 10
    assert g.lease.page_table("kv")[:2] == [0, 1]  # shared, never written again
    assert g.plan == MemoryPlan(copies=(Copy("kv", 2, 3),))  # the page the prefix ends inside
    assert g.lease.page_table("kv")[2] == 3
    # a prompt that leaves the checkpoint mid-page shares less and copies that page
    g2 = grant(p.lease([1, 2, 3, 4, 5, 0, 0], 8))
    assert g2.cached == 5 and g2.plan == MemoryPlan(copies=(Copy("kv", 1, 4),))
    assert g2.lease.page_table("kv") == [0, 4]
    p.check()


def test_match_uses_the_prompt_minus_its_last_token():
    p = pool()
    a = grant(p.lease([1], 8)).lease
    p.extend(a, [1, 2, 3, 4])
    p.checkpoint(a)
    assert p.match([1, 2, 3, 4]).tokens == 3  # the last token must still run
    assert p.match([1, 2, 3, 4, 5]).tokens == 4
    assert p.match([2, 2]).tokens == 0 and p.match([2, 2]).checkpoint is None
    assert p.match([]).tokens == 0


def test_with_a_per_sequence_state_only_whole_checkpoints_match():
    p = pool(states=(KV, REC))
    a = grant(p.lease([1], 8)).lease
    p.extend(a, [1, 2, 3, 4, 5, 6])
    c = p.checkpoint(a)
    assert p.match([1, 2, 3, 4, 5, 0]).tokens == 0  # would need the slot at 5 tokens
    m = p.match([1, 2, 3, 4, 5, 6, 7])
    assert m.tokens == 6 and m.checkpoint is c
    g = grant(p.lease([1, 2, 3, 4, 5, 6, 7], 8))
    assert Copy("rec", c.units[1][0], g.lease.slot("rec")) in g.plan.copies
    p.check()


def test_fork_shares_whole_pages_and_copies_the_rest():
    p = pool(states=(KV, REC))
    a = grant(p.lease([1], 12)).lease
    p.extend(a, [1, 2, 3, 4, 5, 6])
    g = grant(p.fork(a, 12))
    b = g.lease
    assert b.tokens == a.tokens and g.cached == 6
    assert b.page_table("kv")[0] == a.page_table("kv")[0]
    assert b.page_table("kv")[1] != a.page_table("kv")[1]
    assert set(g.plan.copies) == {
        Copy("kv", a.page_table("kv")[1], b.page_table("kv")[1]),
        Copy("rec", a.slot("rec"), b.slot("rec")),
    }
    p.check()


def test_eviction_is_lru_and_leaves_first():
    p = pool(chunks=8)
    a = grant(p.lease([1], 12)).lease
    p.extend(a, [1, 2, 3, 4, 5])
    short = p.checkpoint(a)  # older
    b = grant(p.lease([1, 2, 3, 4, 5, 6, 7], 12)).lease  # extends `short`
    p.extend(b, [6, 7, 8])
    long = p.checkpoint(b)
    c = grant(p.lease([7], 8)).lease
    p.extend(c, [7, 7])
    other = p.checkpoint(c)  # newest
    # `short` is the least recently used, but `long` sits below it: `long` goes first
    assert p.evict_one() is not None and not long.alive and short.alive
    assert p.evict_one() is not None and not short.alive
    assert p.evict_one() is not None and not other.alive
    assert p.evict_one() is None
    p.check()
    assert p.usage()["kv"]["held"] == 0


def test_evict_refusal_then_room():
    p = pool(chunks=2)  # 4 pages
    a = grant(p.lease([1], 8)).lease
    p.extend(a, [1, 2, 3, 4, 5, 6, 7, 8])
    p.checkpoint(a)
    r = p.lease([2, 2], 16)
    assert isinstance(r, Evict) and r.short == (("kv", 2),)
    p.evict_one()
    assert isinstance(p.lease([2, 2], 16), Granted)


def test_slots_short_while_pages_sit_free_gives_a_remap_and_wait_until_done():
    p = pool(chunks=6, states=(KV, REC))  # split: kv 5 chunks (10 pages), rec 1 chunk (6 slots)
    leases = [grant(p.lease([i], 2)).lease for i in range(6)]
    r = p.lease([7], 2)
    assert isinstance(r, Remap)  # the highest empty kv chunk moves to rec
    assert r.plan.unmaps == (Unmap(4, "kv", 4),) and r.plan.maps == (Map(4, "rec", 1),)
    assert isinstance(p.lease([8], 2), Wait)  # the remap is in flight
    p.check()
    p.remapped(r.plan)
    g = grant(p.lease([7], 2))
    assert g.lease.slot("rec") == 6
    with pytest.raises(PoolError, match="not a remap in flight"):
        p.remapped(r.plan)
    for lease in leases + [g.lease]:
        p.free(lease)
    p.check()


def test_pages_come_back_from_slots_too():
    p = pool(chunks=4, states=(KV, REC), split={"kv": 1, "rec": 3})
    r = p.lease([1] * 6, 12)  # 3 pages, kv has 2
    assert isinstance(r, Remap) and r.plan.unmaps == (Unmap(3, "rec", 2),)
    p.remapped(r.plan)
    assert isinstance(p.lease([1] * 6, 12), Granted)


def test_unmapped_chunks_are_mapped_on_demand():
    """The chunk the lease needs (the state's second: twice what it had, so no more)."""
    p = pool(chunks=4, split={"kv": 1})
    r = p.lease([1] * 6, 12)
    assert isinstance(r, Remap) and r.plan == MemoryPlan(maps=(Map(1, "kv", 1),))


def test_slots_granted_one_at_a_time_remap_a_logarithmic_number_of_times():
    """A hybrid's per-sequence slots grow a sequence at a time: 64 one-slot leases, a slot a
    chunk, the state's chunks doubled a remap (1, 2, 4, .. 64: 6 remaps, where the shortfall
    alone would take 63), never past what the leases ask twice over."""
    p = pool(chunks=200, states=(KV, StateDecl("rec", "per_seq", 128)), split={"kv": 199, "rec": 1})
    remaps = 0
    for i in range(64):
        while isinstance(r := p.lease([i, i + 1], 4, cache=False), Remap):
            p.remapped(r.plan)
            remaps += 1
        grant(r)
    assert remaps == 6 and p._device.books[1].opened == 64
    p.check()


def test_park_and_wake_are_byte_identical_and_never_copy_twice():
    p = pool(chunks=16, states=(KV, REC), host=8)
    sim = Sim(p)
    a = sim.request([1, 2, 3, 4, 5, 6, 7, 8, 9], 4)
    sim.step([0], 3)
    c = sim.finish(0, keep=True)
    plan = p.park(c)
    assert isinstance(plan, MemoryPlan) and len(plan.to_host) == 3 + 1  # 3 pages, 1 slot
    sim.run(plan)
    assert not c.on_device and c.parked and p.usage()["kv"]["held"] == 0
    assert p.park(c) == MemoryPlan()  # parking it again copies nothing
    sim.verify()  # host bytes hold the tokens' stamps
    prompt = list(c.tokens) + [5, 5]
    b = sim.request(prompt, 6)  # wakes straight into the new lease
    assert b is not None and sim.outcomes["hit"] == 1
    sim.verify()
    # the next turn ends; parking it copies only what the wake did not bring back whole
    c2 = sim.finish(0, keep=True)
    plan2 = p.park(c2)
    assert isinstance(plan2, MemoryPlan)
    # 12 tokens: pages 0, 1 came back whole from the host; page 2 grew past the wake; the slot
    assert [(t.state, t.unit) for t in plan2.to_host] == [("kv", b.page_table("kv")[2]), ("rec", b.slot("rec"))]
    sim.run(plan2)
    sim.verify()
    del a
    sim.release_all()
    p.check()
    assert p.usage()["kv"]["host_held"] == 0


def test_parking_shared_pages_copies_them_once():
    p = pool(chunks=16, host=8)
    sim = Sim(p)
    sim.request([1, 2, 3, 4, 5, 6, 7, 8, 9, 1], 0)
    c1 = sim.finish(0, keep=True)  # 10 tokens: pages 0, 1 whole, page 2 partial
    sim.request(list(c1.tokens) + [2, 2, 2], 0)
    c2 = sim.finish(0, keep=True)  # shares pages 0, 1; its own copy of page 2, and page 3
    plan1, plan2 = p.park(c1), p.park(c2)
    sim.run(plan1)
    sim.run(plan2)
    assert len(plan1.to_host) == 3 and len(plan2.to_host) == 2
    sim.verify()


def test_evict_one_parks_into_the_host_tier_and_drops_when_it_is_full():
    p = pool(chunks=8, host=1)  # host: 2 pages
    sim = Sim(p)
    sim.request([1, 2, 3, 4, 5], 0)
    c1 = sim.finish(0, keep=True)  # 2 pages
    sim.request([2, 2, 2, 2, 2], 0)
    c2 = sim.finish(0, keep=True)
    sim.run(p.evict_one())  # c1 parks
    assert c1.parked and not c1.on_device
    sim.run(p.evict_one())  # c2 needs the host room: c1's copy goes, c2 parks
    assert not c1.alive and c2.parked
    sim.verify()
    sim.release_all()
    p.check()


def test_never_fits_counts_the_whole_pool():
    p = pool(chunks=4, states=(KV, REC))
    assert isinstance(p.lease([1] * 20, 28), NeverFits)  # 7 pages = 4 chunks, + 1 for the slot


def test_layout_errors_name_the_state():
    with pytest.raises(LayoutError, match=r"states\[1\] \('big'\).*larger than a chunk"):
        pool(states=(KV, StateDecl("big", "per_seq", 4096)))
    with pytest.raises(LayoutError, match="duplicate"):
        pool(states=(KV, KV))
    with pytest.raises(LayoutError, match="kind must be"):
        pool(states=(StateDecl("x", "paged_ish", 4),))


def test_fixed_states_take_chunks_for_good():
    p = pool(chunks=6, states=(KV, StateDecl("table", "fixed", 200)))
    assert p.layout.fixed[0].chunks == 2 and p.layout.dynamic == 4
    assert Map(0, "table", 0) in p.initial_plan.maps and Map(1, "table", 1) in p.initial_plan.maps


def test_cpu_executor_refuses_unmapped_memory_and_poisons_what_leaves():
    p = pool(chunks=4, states=(KV, REC))
    ex = CpuExecutor(p.layout)
    ex.execute(p.initial_plan)
    ex.unit("kv", 5)[:] = 7
    ex.execute(MemoryPlan(unmaps=(Unmap(2, "kv", 2),), maps=(Map(2, "rec", 1),)))
    with pytest.raises(ExecutorError, match="no chunk mapped"):
        ex.unit("kv", 5)
    assert (ex.states["kv"][2 * 128 : 3 * 128] == 0xA5).all()
    with pytest.raises(ExecutorError, match="not mapped there"):
        ex.execute(MemoryPlan(unmaps=(Unmap(2, "kv", 2),)))


def test_a_remap_never_takes_a_chunk_with_a_live_unit():
    p = pool(chunks=6, states=(KV, REC))  # kv places 0-4 (pages 0-9), rec place 0
    a = grant(p.lease([1], 32)).lease
    p.extend(a, list(range(32)))  # pages 0-7
    b = grant(p.lease([2], 4)).lease
    p.extend(b, [2, 2])  # page 8: place 4 now holds one live page
    p.free(a)  # places 0-3 empty; place 4 is not
    slots = [grant(p.lease([3], 1)).lease for _ in range(5)]  # with b: rec is full (6 slots)
    r = p.lease([4], 1)
    assert isinstance(r, Remap) and r.plan.unmaps == (Unmap(3, "kv", 3),), r
    p.check()
    del slots
