"""kern bench on the hybrid: the `slot` role filled from the protocol, and --isolate's walk
starting from the states the whole step started from (a recurrence is not idempotent: walking
from the state the step left gave other logits, and the gate refused the timings)."""

from __future__ import annotations

from kern.bench.run import bench
from kern.bench.workload import parse

WL = parse("samples = 1\n[[sweep]]\ngroups = 2\nrows = 1\ncontext = 20\n[[sweep]]\ngroups = 1\nrows = 9\n"
           "context = 17\n", "wl.toml")


def test_isolate_walks_the_hybrid_from_the_step_s_own_states(kimi_dep, kimi_ckpt):
    doc = bench(kimi_dep, kimi_ckpt, WL, isolate=True, progress=False)
    gates = [sc["isolate"]["gate"] for sc in doc["scenarios"]]
    assert len(gates) == 2 and all(g["ok"] for g in gates), gates
    ops = {c["op"] for sc in doc["scenarios"] for c in sc["isolate"]["calls"]}
    assert {"kda_step", "kda_chunked", "mla_attention_decode", "mla_attention"} <= ops
