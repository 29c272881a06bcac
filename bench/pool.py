"""Pool benchmark: host-side cost of the pool's decisions, and prefix hit rates on an
agent-like trace. Pure Python, no device: plans are counted, not run.

    python bench/pool.py [--quick] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import time

from kern.pool import Evict, Granted, Pool, Remap, StateDecl

MiB = 1 << 20


def settle(pool: Pool, ask, stats: dict | None = None):
    while True:
        r = ask()
        if isinstance(r, Remap):
            pool.remapped(r.plan)
            continue
        if isinstance(r, Evict):
            plan = pool.evict_one()
            if stats is not None and plan is not None:
                stats["parked_pages"] += len(plan.to_host)
            continue
        return r


def timeit(fn, repeat: int) -> float:
    """Median seconds of `repeat` runs of fn()."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


def bench_lease_free(quick: bool) -> dict:
    # a 1B-class KV cache: 32 KiB a token, 16-token pages, 2 MiB chunks, 8 GiB budget
    pool = Pool(8 << 30, [StateDecl("kv", "paged", 32 << 10)], 16)
    prompt = list(range(4096))

    def once():
        g = pool.lease(prompt, 4096 + 512)
        assert isinstance(g, Granted)
        pool.extend(g.lease, prompt)
        pool.free(g.lease)

    t = timeit(once, 50 if quick else 300)
    return {"lease_extend_free_4k_us": round(t * 1e6, 1)}


def bench_match(quick: bool) -> dict:
    rnd = random.Random(1)
    pool = Pool(4 << 30, [StateDecl("kv", "paged", 128)], 16)
    systems = [[rnd.randrange(32000) for _ in range(1024)] for _ in range(20)]
    n = 2000 if quick else 10_000
    for i in range(n):
        prompt = systems[i % 20] + [rnd.randrange(32000) for _ in range(64)]
        g = pool.lease(prompt, len(prompt))
        assert isinstance(g, Granted), g
        pool.extend(g.lease, prompt[g.cached :])
        pool.checkpoint(g.lease)
    # one long conversation checkpointed at 30k tokens; the prompt carries it on to 32k
    long = systems[3] + [rnd.randrange(32000) for _ in range(30_000 - 1024)]
    g = pool.lease(long, len(long))
    pool.extend(g.lease, long[g.cached :])
    pool.checkpoint(g.lease)
    prompt = long + [rnd.randrange(32000) for _ in range(32_768 - len(long))]
    m = pool.match(prompt)
    assert m.tokens == 30_000, m
    miss = [rnd.randrange(32000) for _ in range(32_768)]
    t_hit = timeit(lambda: pool.match(prompt), 50)
    t_miss = timeit(lambda: pool.match(miss), 50)
    t_sys = timeit(lambda: pool.match(systems[7] + miss[:31_744]), 50)
    return {
        "checkpoints": len(pool.checkpoints()),
        "match_32k_hit_30k_us": round(t_hit * 1e6, 1),
        "match_32k_hit_system_prompt_us": round(t_sys * 1e6, 1),
        "match_32k_miss_us": round(t_miss * 1e6, 1),
    }


def bench_step(quick: bool) -> dict:
    pool = Pool(24 << 30, [StateDecl("kv", "paged", 32 << 10)], 16)
    leases = []
    for i in range(256):
        g = pool.lease([i] * (100 + i), 2560)
        assert isinstance(g, Granted)
        pool.extend(g.lease, [i] * (100 + i))
        leases.append(g.lease)
    tokens = [7] * 256
    steps = 320 if quick else 2048
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        stuck = pool.advance(leases, tokens)
        times.append(time.perf_counter() - t0)
        assert not stuck
    pool.check()
    times.sort()
    return {
        "step_256_seqs_median_us": round(times[len(times) // 2] * 1e6, 1),
        "step_256_seqs_p99_us": round(times[int(len(times) * 0.99)] * 1e6, 1),
    }


def agent_trace(seed: int, sessions: int, turns: int) -> list[tuple[int, list[int], list[int]]]:
    """(session, user message, reply) in arrival order: multi-turn sessions sharing a few
    system prompts, their histories growing turn by turn, interleaved."""
    rnd = random.Random(seed)
    systems = [[rnd.randrange(32000) for _ in range(rnd.randrange(800, 2400))] for _ in range(4)]
    first = {s: systems[s % 4] for s in range(sessions)}
    left = {s: turns for s in range(sessions)}
    trace = []
    active: list[int] = []
    nxt = 0
    while left:
        while len(active) < 24 and nxt < sessions:
            active.append(nxt)
            nxt += 1
        s = active[rnd.randrange(len(active))]
        user = [rnd.randrange(32000) for _ in range(rnd.randrange(20, 400))]
        reply = [rnd.randrange(32000) for _ in range(rnd.randrange(20, 300))]
        if left[s] == turns:
            user = first[s] + user
        trace.append((s, user, reply))
        left[s] -= 1
        if not left[s]:
            del left[s]
            active.remove(s)
    return trace


def run_trace(trace, device_tokens: int, host_tokens: int) -> dict:
    bpt, pt = 32 << 10, 16
    pool = Pool(device_tokens * bpt, [StateDecl("kv", "paged", bpt)], pt, host_bytes=host_tokens * bpt)
    history: dict[int, list[int]] = {}
    prompt_tokens = cached = 0
    stats = {"parked_pages": 0}
    woken = 0
    for s, user, reply in trace:
        prompt = history.get(s, []) + user
        g = settle(pool, lambda: pool.lease(prompt, len(prompt) + len(reply)), stats)
        assert isinstance(g, Granted), g
        woken += len(g.plan.from_host)
        prompt_tokens += len(prompt)
        cached += g.cached
        pool.extend(g.lease, prompt[g.cached :])
        pool.extend(g.lease, reply[:-1])  # the last sampled token's state is never written
        pool.checkpoint(g.lease)
        history[s] = prompt + reply
    pool.check()
    return {
        "requests": len(trace),
        "prompt_tokens": prompt_tokens,
        "hit_rate": round(cached / prompt_tokens, 4),
        "pages_parked": stats["parked_pages"],
        "pages_woken": woken,
    }


def bench_trace(quick: bool) -> dict:
    trace = agent_trace(1, sessions=60 if quick else 200, turns=6)
    device = 32 * 1024  # tokens of KV the device budget holds
    return {
        "trace": "agent-like: 4 system prompts (800-2400 tokens), sessions of 6 turns, 24 live at a time",
        "device_tokens": device,
        "no_host_tier": run_trace(trace, device, 0),
        "host_tier_4x": run_trace(trace, device, 4 * device),
        "unbounded_device": run_trace(trace, 64 * device, 0),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    out = {"python": sys.version.split()[0], "machine": platform.machine()}
    for part in (bench_lease_free, bench_step, bench_match, bench_trace):
        t0 = time.perf_counter()
        out[part.__name__] = part(a.quick)
        out[part.__name__]["wall_s"] = round(time.perf_counter() - t0, 1)
        print(part.__name__, json.dumps(out[part.__name__]), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
