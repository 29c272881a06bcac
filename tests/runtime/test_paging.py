"""The pool bound to an engine: chunk sizes that fit pages and the device's mapping
granularity, the initial plan mapping every chunk once, page copies at page offsets."""

from __future__ import annotations

from math import lcm

import pytest

from kern.manifest import load_verified
from kern.runtime.paging import MIN_CHUNK, Paging, declarations, plan_pool, state_sizes


class _Engine:
    """Records what the paging layer asks of an engine."""

    def __init__(self):
        self.remaps, self.copies = [], []

    def remap_state(self, state, unmap, map):
        self.remaps.append((state, list(unmap), list(map)))

    def copy_state(self, state, dst, src, n):
        self.copies.append((state, dst, src, n))


@pytest.fixture(scope="module")
def verified(tiny):
    return load_verified(tiny[1])


@pytest.mark.parametrize("granularity", [1, 2 << 20])
def test_chunks_hold_whole_pages_and_respect_the_mapping_granularity(verified, granularity):
    decls, chunk = declarations(verified, 16, granularity)
    (kv,) = decls
    page = kv.size * 16
    assert chunk % page == 0 and chunk % granularity == 0 and chunk >= MIN_CHUNK
    assert chunk == lcm(page, granularity) * -(-MIN_CHUNK // lcm(page, granularity))


def test_the_initial_plan_maps_every_dynamic_chunk_once(verified):
    eng = _Engine()
    paging = Paging(plan_pool(verified, 16, 64 << 20, granularity=2 << 20), eng)
    ((state, unmap, mapped),) = eng.remaps
    n = paging.pool.layout.dynamic
    assert state == "kv" and unmap == []
    assert sorted(p for p, _ in mapped) == list(range(n))  # physical chunks, numbered from 0
    assert sorted(v for _, v in mapped) == list(range(n))  # places in the state's virtual range
    assert state_sizes(paging.pool)["kv"] == n * paging.pool.layout.chunk_bytes


def test_a_cached_prefix_ending_inside_a_page_copies_that_page(verified):
    eng = _Engine()
    paging = Paging(plan_pool(verified, 16, 64 << 20), eng)
    first = paging.lease(list(range(40)), 48)
    paging.extend(first.lease, list(range(40)))
    paging.pool.checkpoint(first.lease)
    second = paging.lease(list(range(40)) + [7, 8], 64)
    assert second.cached == 40
    ((state, dst, src, n),) = eng.copies  # 40 = 2 whole shared pages + 8 tokens of the third
    unit = paging.kinds["kv"].unit_bytes
    assert state == "kv" and n == unit and dst % unit == 0 and src % unit == 0 and dst != src
    assert second.lease.page_table("kv")[:2] == first.lease.page_table("kv")[:2]
