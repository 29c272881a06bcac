"""Random operation sequences against the byte-level reference model (sim.Sim): after every
operation the integrity check passes and every holder reads back exactly its tokens' bytes;
a lease or checkpoint that has ended is refused by every call, changing nothing; at the end,
releasing everything returns every unit and chunk."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kern.pool import MemoryPlan, PoolError

from .sim import Sim, make_pool

SYSTEM = ([1, 2, 3, 1, 2, 3, 1], [1, 2, 3, 4, 4], [5, 0, 5, 0, 5, 0, 5, 0, 5])
tail = st.lists(st.integers(0, 5), min_size=1, max_size=7)


class PoolMachine(RuleBasedStateMachine):
    config = "paged"

    def __init__(self) -> None:
        super().__init__()
        self.sim = Sim(make_pool(self.config), hold_remaps=True)
        self.dropped: list = []  # checkpoints dropped by the drop rule

    @rule(sys=st.integers(0, len(SYSTEM) - 1), cut=st.integers(0, 9), t=tail, extra=st.integers(0, 8), cache=st.booleans())
    def request(self, sys, cut, t, extra, cache):
        self.sim.request(SYSTEM[sys][: max(1, cut)] + t, extra, cache=cache)

    @precondition(lambda self: self.sim.ckpt_tokens)
    @rule(i=st.integers(0, 1 << 16), t=tail, extra=st.integers(0, 8))
    def next_turn(self, i, t, extra):
        """A session's next turn: its whole history plus a new message."""
        cs = self.sim.pool.checkpoints()
        if cs:
            self.sim.request(list(cs[i % len(cs)].tokens) + t, extra)

    @precondition(lambda self: self.sim.leases)
    @rule(mask=st.integers(1, (1 << 8) - 1), token=st.integers(0, 5), times=st.integers(1, 5))
    def step(self, mask, token, times):
        picks = [i for i in range(len(self.sim.leases)) if mask >> (i % 8) & 1]
        for _ in range(times):
            self.sim.step(picks, token)

    @precondition(lambda self: self.sim.leases)
    @rule(i=st.integers(0, 1 << 16), keep=st.booleans())
    def finish(self, i, keep):
        self.sim.finish(i % len(self.sim.leases), keep or i % 5 != 0)

    @precondition(lambda self: self.sim.leases)
    @rule(i=st.integers(0, 1 << 16), extra=st.integers(0, 6))
    def fork(self, i, extra):
        self.sim.fork(i % len(self.sim.leases), extra)

    @rule()
    def evict(self):
        plan = self.sim.pool.evict_one()
        if plan is not None:
            self.sim.run(plan)

    @precondition(lambda self: self.sim.ckpt_tokens)
    @rule(i=st.integers(0, 1 << 16), twice=st.booleans())
    def park(self, i, twice):
        cs = self.sim.pool.checkpoints()
        if not cs:
            return
        c = cs[i % len(cs)]
        r = self.sim.pool.park(c)
        if isinstance(r, MemoryPlan):
            self.sim.run(r)
            if twice:
                assert not self.sim.pool.park(c), "parking a parked checkpoint copied again"

    @precondition(lambda self: self.sim.ckpt_tokens)
    @rule(i=st.integers(0, 1 << 16))
    def drop(self, i):
        cs = self.sim.pool.checkpoints()
        if cs:
            self.sim.pool.drop(cs[i % len(cs)])
            self.dropped.append(cs[i % len(cs)])

    @precondition(lambda self: self.sim.ended or self.dropped)
    @rule(i=st.integers(0, 1 << 16), op=st.integers(0, 6))
    def misuse(self, i, op):
        """An ended lease or a dropped checkpoint, handed back to the pool."""
        p, live = self.sim.pool, [lease for lease, _ in self.sim.leases]
        gone = (self.sim.ended + self.dropped)[i % (len(self.sim.ended) + len(self.dropped))]
        calls = [
            lambda: p.extend(gone, [1]),
            lambda: p.advance(live + [gone], [1] * (len(live) + 1)),
            lambda: p.free(gone),
            lambda: p.checkpoint(gone),
            lambda: p.fork(gone, 64),
            lambda: p.drop(gone),
            lambda: p.park(gone),
        ]
        before = p.usage(), [(x.id, list(x.tokens), x.reserved) for x in p.leases]
        with pytest.raises(PoolError, match=re.escape(repr(gone))):
            calls[op]()
        assert (p.usage(), [(x.id, list(x.tokens), x.reserved) for x in p.leases]) == before

    @precondition(lambda self: self.sim.remaps)
    @rule()
    def remap_done(self):
        self.sim.ack()

    @invariant()
    def books_and_bytes(self):
        self.sim.pool.check()
        self.sim.verify()

    def teardown(self):
        self.sim.release_all()
        pool = self.sim.pool
        pool.check()
        use = pool.usage()
        chunks = use.pop("chunks")
        assert chunks["in_flight"] == 0
        mapped = 0
        for name, u in use.items():
            assert u["held"] == u["reserved"] == u["cached"] == u["host_held"] == 0, (name, u)
            assert u["free"] == u["mapped"], (name, u)
            mapped += u["mapped"] // pool.layout.kind(name).per_chunk
        assert mapped + chunks["unmapped"] == chunks["dynamic"], "a chunk leaked"


RUN = settings(
    max_examples=150,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    derandomize=True,
)


@RUN
class PagedOnly(PoolMachine):
    config = "paged"


@RUN
class PagedPlusSeq(PoolMachine):
    config = "paged+seq"


@RUN
class Mixed(PoolMachine):
    config = "mixed"


TestPagedOnly = PagedOnly.TestCase
TestPagedPlusSeq = PagedPlusSeq.TestCase
TestMixed = Mixed.TestCase
