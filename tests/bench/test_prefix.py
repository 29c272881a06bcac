"""Attribution by prefixes (kern.bench.prefix), the method kern bench uses on CUDA, driven by
a clock whose answers are known: each call's time comes back exactly, the calls sum to the
step less its base, every prefix is timed once a sample behind a run of the whole program,
and the order is shuffled but seeded."""

from __future__ import annotations

import pytest

from kern.bench.prefix import boundaries, by_prefix


class Prefix:
    """A run whose device time the fake clock knows."""

    def __init__(self, us: float):
        self.us = us

    def __call__(self) -> None:
        pass


class KnownClock:
    def __init__(self):
        self.orders: list[list[float]] = []

    def elapsed(self, pairs):
        assert all(warm is pairs[0][0] for warm, _ in pairs)  # every timed run follows the whole program
        self.orders.append([run.us for _, run in pairs])
        return [run.us for _, run in pairs]


COSTS = [3.0, 40.0, 0.5, 12.0]
BASE = 6.0


def prefixes() -> list[Prefix]:
    return [Prefix(BASE + sum(COSTS[:k])) for k in range(len(COSTS) + 1)]


def test_each_call_gets_its_own_time_and_the_calls_sum_to_the_step_less_its_base():
    ps = prefixes()
    got = by_prefix(KnownClock(), ps, ps[-1], samples=3, host=lambda: 99.0, method="known")
    assert got.calls == [[c] * 3 for c in COSTS]
    assert got.base == [BASE] * 3 and got.step == [BASE + sum(COSTS)] * 3 and got.host == [99.0] * 3
    assert sum(c[0] for c in got.calls) == pytest.approx(got.step[0] - got.base[0])


def test_every_prefix_and_the_step_are_timed_once_a_sample_in_a_seeded_shuffled_order():
    ps = prefixes()
    a, b, c = KnownClock(), KnownClock(), KnownClock()
    by_prefix(a, ps, ps[-1], samples=4, host=lambda: 0.0, method="known", seed=0)
    by_prefix(b, ps, ps[-1], samples=4, host=lambda: 0.0, method="known", seed=0)
    by_prefix(c, ps, ps[-1], samples=4, host=lambda: 0.0, method="known", seed=1)
    assert len(a.orders) == 5  # one warming sample, dropped
    want = sorted([p.us for p in ps] + [ps[-1].us])
    assert all(sorted(o) == want for o in a.orders)
    assert a.orders == b.orders != c.orders
    assert len({tuple(o) for o in a.orders}) > 1


def test_a_call_boundary_counts_the_launches_before_it():
    # calls 0 and 2 make two launches each, call 1 one
    assert boundaries([0, 0, 1, 2, 2], 3) == [0, 2, 3, 5]
