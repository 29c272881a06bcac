"""The hybrid's two states from one budget (pure planning, a stand-in for the device's memory):
the MLA cache's pages and the KDA state's slots are chunks of one pool, remapped between the
states as the load asks, each chunk in one place at a time. A mix that neither fixed split of
the same budget holds (first many short sequences: slots; then two long ones: pages) is served."""

from __future__ import annotations

import pytest

from kern.manifest import load_verified
from kern.runtime.paging import Paging, declarations, plan_pool


class OneSetOfChunks:
    """An engine's state memory as the cuda device has it: one set of physical chunks, each
    mapped into at most one state's virtual range at a time."""

    def __init__(self):
        self.at: dict[int, tuple[str, int]] = {}  # chunk -> (state, place in its range)
        self.moves = 0

    def remap_state(self, state, unmap, map):
        for v in unmap:
            (chunk,) = [c for c, where in self.at.items() if where == (state, v)]
            del self.at[chunk]
        for chunk, v in map:
            assert chunk not in self.at, f"chunk {chunk} mapped twice ({self.at[chunk]} and {state})"
            assert (state, v) not in self.at.values()
            self.at[chunk] = (state, v)
            self.moves += 1

    def copy_state(self, state, dst, src, n):
        pass


@pytest.fixture
def hybrid(kimi_dep):
    v = load_verified(kimi_dep / "manifest.json")
    eng = OneSetOfChunks()
    _, chunk = declarations(v, 16)
    paging = Paging(plan_pool(v, 16, 4 * chunk), eng)  # a budget of four chunks
    return paging, eng


def test_the_budget_is_one_set_of_chunks_for_both_states(hybrid):
    paging, eng = hybrid
    lay = paging.pool.layout
    assert lay.dynamic == 4 and {k.name for k in lay.kinds} == {"kv", "kda"}
    assert sorted(eng.at) == list(range(4)) and {s for s, _ in eng.at.values()} == {"kv", "kda"}


def test_short_then_long_sequences_that_no_fixed_split_holds(hybrid):
    paging, eng = hybrid
    lay = paging.pool.layout
    slots_a_chunk, pages_a_chunk = (next(k.per_chunk for k in lay.kinds if k.name == n) for n in ("kda", "kv"))
    short, long = 3 * slots_a_chunk, 2 * (pages_a_chunk * 16 + 8 * 16)  # 3 chunks of slots; 3 of pages
    leases = [paging.lease([], 16, cache=False).lease for _ in range(short)]  # a slot and a page each
    assert len({l.slot("kda") for l in leases}) == short
    for l in leases:
        paging.pool.free(l)
    first = eng.moves
    big = [paging.lease([], long // 2, cache=False).lease for _ in range(2)]
    assert eng.moves > first  # chunks went back from slots to pages: remapped, not copied
    assert sum(1 for s, _ in eng.at.values() if s == "kv") >= 3 and len(eng.at) == 4
    # a fixed split holds phase one only with 3 slot chunks and phase two only with 3 page chunks
    assert -(-short // slots_a_chunk) + -(-(long // 16) // pages_a_chunk) > lay.dynamic
    for l in big:
        paging.pool.free(l)
    paging.pool.check()


def test_the_real_model_s_units_tile_a_chunk_of_a_few_tens_of_mib():
    """The published shape's MLA page and KDA slot, padded by the generator, have a common
    multiple the pool can use as its chunk (unpadded: about 90 GB)."""
    from math import lcm

    from kern_models.kimi_linear.config import shape_of
    from kern_models.kimi_linear.manifests.common import PAGE_TOKENS, state_constants
    from tests.kimi_linear.test_config import PUBLISHED

    s = shape_of(PUBLISHED)
    raw_page, raw_slot = 7 * 576 * 2 * PAGE_TOKENS, 20 * (32 * 128 * 128 + 3 * 3 * 4096) * 4
    assert lcm(raw_page, raw_slot, 2 << 20) > 80e9
    for elem in (2, 4):  # bf16 (cuda) and f32 (cpu) caches
        c = state_constants(s, elem)
        page, slot = c["kv_token_bytes"] * PAGE_TOKENS, c["kda_slot_bytes"]
        assert slot >= raw_slot and page >= 7 * 576 * elem * PAGE_TOKENS
        assert lcm(page, slot, 2 << 20) == slot <= 1.03 * raw_slot  # one slot a chunk, 3% padding at most


def test_the_host_loop_serves_a_mix_at_one_budget_that_no_fixed_split_holds(kimi_config, kimi_ckpt, kimi_model,
                                                                              tmp_path, monkeypatch):
    """kern.api.Model on a budget of five chunks (chunks of 64 KiB here: 16 pages or 2 slots):
    seven short requests at once need four chunks of slots, then three long ones at once need
    three chunks of pages. A fixed split holds one phase or the other; the one budget, remapping
    chunks between the states as the load turns, serves both with the same tokens as the model
    stepped alone."""
    from kern.api import Model
    from kern.generation.params import SamplingParams
    from kern_models.kimi_linear.generator import generate
    from tests.kimi_linear.test_host_loop import greedy, prompt, serve

    import kern.runtime.paging as paging_mod

    monkeypatch.setattr(paging_mod, "MIN_CHUNK", 64 << 10)
    dep = generate(kimi_config, tmp_path / "dep", target="cpu", model="tiny-kimi", tokens=64, seqs=8, context=256)
    model = Model(dep, kimi_ckpt, state_budget=5 * (64 << 10), max_seqs=8)
    pool = model.loop.paging.pool
    kv, kda = pool.layout.kinds
    assert (pool.layout.dynamic, kv.per_chunk, kda.per_chunk) == (5, 16, 2)
    peak = {"running": 0, "kv": 0, "kda": 0}

    def watch(loop):
        use = pool.usage()
        peak["running"] = max(peak["running"], len(loop.running))
        for k in ("kv", "kda"):
            peak[k] = max(peak[k], use[k]["mapped"])

    for phase, (n, length, new) in enumerate([(7, 4, 2), (3, 190, 8)]):
        peak.update(running=0, kv=0, kda=0)
        reqs = {f"{phase}.{i}": (prompt(30 * phase + i, length), SamplingParams(max_tokens=new)) for i in range(n)}
        got = serve(model, reqs, watch)
        assert peak["running"] == n  # all of them at once
        for rid in list(reqs)[:2]:
            assert got[rid][0] == greedy(kimi_model, reqs[rid][0], new), rid
        if phase == 0:
            assert peak["kda"] == 4 * kda.per_chunk  # 7 slots and the scratch row's: four chunks of slots
        else:
            assert peak["kv"] >= 3 * kv.per_chunk  # 3 x 13 pages and the scratch row's: three chunks of pages
    # a fixed split: phase one leaves at most one chunk for pages, phase two needs three
    assert 4 + 3 > pool.layout.dynamic
    pool.check()
