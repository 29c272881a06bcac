"""What the server's pool calls cost the host at a model's real shape and a device-sized budget,
no device: the Kimi-Linear-48B-A3B shape's manifest (sm_90a build, `--layers` deep), its states
planned as on the H200 (`--budget-gib`), and the calls the generation loop makes for `--seqs`
requests admitted at once (a lease each, its prompt written, `--steps` decode steps extended a
token at a time, a checkpoint at the end), `--rounds` times over (finished requests keep their
pages and slots as cached checkpoints, as on a server). The engine's side of a plan (remap,
copy) does nothing here: `python3 -m bench.probes.remap_cost` prices it on a GPU. Prints a
JSON line a round: calls, host ms and remaps by kind of call.

    python3 -m bench.probes.admission_host [--seqs 64] [--rounds 2] [--steps 64]
"""
import argparse
import collections
import json
import tempfile
import time

import numpy as np
import transformers

from kern.manifest import load_verified
from kern.runtime.paging import Paging, plan_pool
from kern_models.kimi_linear.generator import generate
from kern_models.kimi_linear.random_checkpoint import shape_config


class NoDevice:
    """The engine's States with nothing behind them: plans are run as calls that do nothing."""

    def remap_state(self, *a, **k): pass
    def copy_state(self, *a): pass
    def write_state(self, *a): pass
    def read_state(self, state, offset, n): return np.zeros(n, np.uint8)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--budget-gib", type=float, default=97.2)  # the H200's, kern serve's default
    ap.add_argument("--page-tokens", type=int, default=16)
    ap.add_argument("--seqs", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    cfg = transformers.KimiLinearConfig(**shape_config("kimi-linear-48b-a3b", a.layers)).to_dict()
    cfg["architectures"] = ["KimiLinearForCausalLM"]
    with tempfile.TemporaryDirectory() as d:
        v = load_verified(generate(cfg, d, target="cuda"))
    pool = plan_pool(v, a.page_tokens, int(a.budget_gib * 2**30), 2 << 20)
    paging = Paging(pool, NoDevice())
    ms, calls = collections.defaultdict(float), collections.Counter()
    remapped = pool.remapped

    def counted(plan):
        calls["remaps"] += 1
        return remapped(plan)

    pool.remapped = counted

    def timed(kind, f, *args):
        t = time.perf_counter()
        r = f(*args)
        ms[kind] += (time.perf_counter() - t) * 1e3
        calls[kind] += 1
        return r

    for rnd in range(a.rounds):
        leases = []
        for i in range(a.seqs):
            prompt = [(rnd * 7919 + i * 104729 + j) % 100_000 for j in range(a.prompt)]
            leases.append((timed("lease", paging.try_lease, prompt, a.prompt + a.steps).lease, prompt))
            timed("usage", pool.usage)  # the loop's stats, every step
        for lease, prompt in leases:
            timed("extend", paging.extend, lease, prompt, 1)
        for _ in range(a.steps):
            for lease, _ in leases:
                timed("extend", paging.extend, lease, [5], 1)
            timed("usage", pool.usage)
        for lease, _ in leases:
            timed("checkpoint", pool.checkpoint, lease)
        print(json.dumps({"round": rnd, "seqs": a.seqs, "chunk_mib": pool.layout.chunk_bytes >> 20,
                          "remaps": calls.pop("remaps", 0),
                          "calls": {k: [calls[k], round(ms[k], 1)] for k in ms}}))
        ms.clear()
        calls.clear()


if __name__ == "__main__":
    main()
