"""A runtime stand-in for the pool tests: it runs every plan on a CpuExecutor, stamps each
position it writes with its token, position and a hash of the prefix (and each slot with
the whole sequence), and keeps its own record of what every holder should read back."""

from __future__ import annotations

import numpy as np

from kern.pool import (
    Checkpoint,
    Evict,
    Granted,
    Lease,
    NeverFits,
    MemoryPlan,
    Pool,
    Remap,
    StateDecl,
    Wait,
)

from .executor import CpuExecutor

M64 = (1 << 64) - 1


def prefix_hashes(tokens) -> list[int]:
    out, h = [], 1469598103934665603
    for t in tokens:
        h = (h * 1099511628211 + t + 1) & M64
        out.append(h)
    return out


def token_stamp(tokens, size: int, salt: int) -> np.ndarray:
    """[len(tokens), size] bytes: token, position, prefix hash, repeated, xor salt."""
    n = len(tokens)
    rec = np.zeros((n, 2), np.uint64)
    if n:
        rec[:, 0] = np.asarray(tokens, np.uint64) | (np.arange(n, dtype=np.uint64) << np.uint64(32))
        rec[:, 1] = np.asarray(prefix_hashes(tokens), np.uint64)
    raw = rec.view(np.uint8).reshape(n, 16)
    reps = -(-size // 16)
    return np.tile(raw, (1, reps))[:, :size] ^ np.uint8(salt)


def seq_stamp(tokens, size: int, salt: int) -> np.ndarray:
    h = prefix_hashes(tokens)[-1] if tokens else 7
    rec = np.array([h, len(tokens), tokens[-1] if tokens else 0], np.uint64).view(np.uint8)
    return np.resize(rec, size) ^ np.uint8(salt)


class Sim:
    def __init__(self, pool: Pool, *, hold_remaps: bool = False) -> None:
        self.pool = pool
        self.pt = pool.layout.page_tokens
        self.ex = CpuExecutor(pool.layout)
        self.ex.execute(pool.initial_plan)
        self.leases: list[tuple[Lease, list[int]]] = []  # live leases and the tokens they hold
        self.ended: list[Lease] = []  # freed or checkpointed: every pool call must refuse them
        self.ckpt_tokens: dict[int, tuple[int, ...]] = {}  # checkpoint id -> tokens it holds
        self.remaps: list[MemoryPlan] = []  # run, not yet acknowledged
        self.hold_remaps = hold_remaps
        self.log: list[str] = []
        self.outcomes: dict[str, int] = {}

    # -- running plans ----------------------------------------------------------------
    def run(self, plan: MemoryPlan) -> None:
        self.ex.execute(plan)
        self.log.append(repr(plan))

    def note(self, what: str) -> None:
        self.outcomes[what] = self.outcomes.get(what, 0) + 1

    def settle(self, ask):
        """Ask the pool until it grants or refuses for good: run remaps, evict on Evict."""
        for _ in range(10_000):
            r = ask()
            self.log.append(type(r).__name__ if r is None or not isinstance(r, Granted) else f"Granted {r.cached}")
            if isinstance(r, Remap):
                self.note("remap")
                self.run(r.plan)
                self.remaps.append(r.plan)
                if self.hold_remaps:
                    return r
                self.ack()
                continue
            if isinstance(r, Evict):
                self.note("evict")
                plan = self.pool.evict_one()
                assert plan is not None, "pool said Evict with nothing to evict"
                self.run(plan)
                continue
            if isinstance(r, (Wait, NeverFits)):
                self.note(type(r).__name__)
            return r
        raise AssertionError("pool never settled")

    def ack(self) -> None:
        for plan in self.remaps:
            self.pool.remapped(plan)
        self.remaps = []

    # -- writing state, as a model would ----------------------------------------------
    def write(self, lease: Lease, tokens: list[int], start: int) -> None:
        L = self.pool.layout
        for k in L.kinds:
            if k.paged:
                stamps = token_stamp(tokens, k.unit_bytes // self.pt, k.index)
                pages = lease.page_table(k.name)
                per = k.unit_bytes // self.pt
                for i in range(start, len(tokens)):
                    page = self.ex.unit(k.name, pages[i // self.pt])
                    page[(i % self.pt) * per : (i % self.pt + 1) * per] = stamps[i]
            elif len(tokens) > start or start == 0:
                self.ex.unit(k.name, lease.slot(k.name))[:] = seq_stamp(tokens, k.unit_bytes, k.index)

    def read_ok(self, tokens, units, host: bool) -> bool:
        """Do these units (device, or host units when `host`) hold exactly `tokens`' state?"""
        L = self.pool.layout
        for k in L.kinds:
            us = units[k.index]
            if k.paged:
                per = k.unit_bytes // self.pt
                want = token_stamp(tokens, per, k.index)
                for i in range(len(tokens)):
                    u = us[i // self.pt]
                    mem = self.ex.host_range(k.name, L.offset(k, u)) if host else self.ex.unit(k.name, u)
                    if not np.array_equal(mem[(i % self.pt) * per : (i % self.pt + 1) * per], want[i]):
                        return False
            elif tokens:  # a fresh slot holds nothing yet
                mem = self.ex.host_range(k.name, L.offset(k, us[0])) if host else self.ex.unit(k.name, us[0])
                if not np.array_equal(mem, seq_stamp(list(tokens), k.unit_bytes, k.index)):
                    return False
        return True

    # -- requests ---------------------------------------------------------------------
    def request(self, prompt: list[int], extra: int, cache: bool = True) -> Lease | None:
        r = self.settle(lambda: self.pool.lease(prompt, len(prompt) + extra, cache=cache))
        if not isinstance(r, Granted):
            return None
        return self._granted(r, prompt)

    def _granted(self, g: Granted, want: list[int]) -> Lease:
        self.note("hit" if g.cached else "miss")
        self.run(g.plan)
        lease = g.lease
        assert lease.tokens == want[: g.cached]
        assert self.read_ok(want[: g.cached], lease.units, host=False), "restored prefix reads back wrong bytes"
        self.log.append(f"lease {lease.id} " + repr(lease.units))
        r = self.settle(lambda: self.pool.extend(lease, want[g.cached :]))
        assert r is None, f"extend within the reservation refused: {r}"
        self.write(lease, want, g.cached)
        self.leases.append((lease, list(want)))
        return lease

    def fork(self, i: int, extra: int) -> Lease | None:
        parent, toks = self.leases[i]
        r = self.settle(lambda: self.pool.fork(parent, len(toks) + extra))
        if not isinstance(r, Granted):
            return None
        return self._granted(r, toks)

    def step(self, picks: list[int], token: int) -> None:
        chosen = [self.leases[i] for i in picks]
        stuck = self.pool.advance([l for l, _ in chosen], [token] * len(chosen))
        stuck_ids = {l.id for l, _ in stuck}
        for lease, r in stuck:
            self.log.append(f"stuck {lease.id} {type(r).__name__}")
            if isinstance(r, Remap):
                self.run(r.plan)
                self.remaps.append(r.plan)
                if not self.hold_remaps:
                    self.ack()
        for lease, toks in chosen:
            if lease.id not in stuck_ids:
                toks.append(token)
                self.write(lease, toks, len(toks) - 1)

    def finish(self, i: int, keep: bool) -> Checkpoint | None:
        lease, toks = self.leases.pop(i)
        self.ended.append(lease)
        if not keep:
            self.pool.free(lease)
            return None
        ckpt = self.pool.checkpoint(lease)
        if ckpt is not None:
            assert ckpt.tokens == tuple(toks)
            self.ckpt_tokens[ckpt.id] = tuple(toks)
            self.log.append(f"ckpt {ckpt.id}")
        return ckpt

    # -- the reference check ----------------------------------------------------------
    def verify(self) -> None:
        for lease, toks in self.leases:
            assert lease.tokens == toks, f"{lease} tokens drifted"
            assert self.read_ok(toks, lease.units, host=False), f"{lease} reads back wrong bytes"
        for c in self.pool.checkpoints():
            assert c.tokens == self.ckpt_tokens[c.id], f"{c} holds other tokens than it was given"
            if c.units is not None:
                assert self.read_ok(c.tokens, c.units, host=False), f"{c} device bytes are wrong"
            if c.host is not None:
                assert self.read_ok(c.tokens, c.host, host=True), f"{c} host bytes are wrong"

    def release_all(self) -> None:
        self.ack()
        while self.leases:
            self.pool.free(self.leases.pop()[0])
        self.pool.clear()


def make_pool(config: str) -> Pool:
    """Small pools with tight budgets, so remaps, eviction and parking happen often."""
    if config == "paged":
        states = [StateDecl("kv", "paged", 16)]
        return Pool(12 * 128, states, 4, chunk_bytes=128, host_bytes=6 * 128)
    if config == "paged+seq":
        states = [StateDecl("kv", "paged", 16), StateDecl("rec", "per_seq", 20)]
        return Pool(14 * 128, states, 4, chunk_bytes=128, host_bytes=8 * 128)
    if config == "mixed":
        states = [
            StateDecl("a", "paged", 16),
            StateDecl("b", "paged", 8),
            StateDecl("c", "per_seq", 40),
            StateDecl("d", "fixed", 200),
        ]
        return Pool(20 * 128, states, 4, chunk_bytes=128, host_bytes=0, split={"a": 3, "b": 2, "c": 1})
    raise KeyError(config)
