"""Wall time to a kern test verdict for SmolLM2-135M, A vs B, on the default (full-size) workload.

    python bench/kern_test.py [--candidates identical,reduction_reordered,kv_off_by_one] [--json]

A is the generated cpu manifest of the embedded model; each B is a planted candidate from
tests/judge/planted.py, or from tests/judge/fused.py (`fused`: the same arithmetic, its calls
fused as the sm_90a build fuses them; `fused_o_proj_swapped`, `fused_post_norm_is_pre_norm`:
bugs planted in it). Prints one line per verdict (seconds, verdict) and, with --json, the
phase timings. Targets: <= 60 s per verdict on the 2-core CPU machine, <= 10 s on the H200."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

from shared import repo_import


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--candidates", default="identical,embed_swapped,reduction_reordered,kv_off_by_one,lm_head_prenorm")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from kern.judge.judge import Options, judge
    from kern_models.embedded import prepare
    from kern_models.llama.generator import generate

    planted = repo_import("tests.judge.planted")
    ckpt = prepare(progress=False)
    tmp = Path(tempfile.mkdtemp(prefix="kern-test-bench-"))
    a = generate(json.loads((ckpt / "config.json").read_text()), tmp / "a", model="SmolLM2-135M-Instruct").parent
    fused = repo_import("tests.judge.fused")  # programs fused differently, as a GPU build's are

    def fused_bug(bug):
        return lambda base, out: bug(fused.fused(base, out.with_name(out.name + "-base")), out)

    makers = {"identical": lambda base, out: base, **planted.FAILS,
              "embed_swapped": planted.embed_swapped, "reduction_reordered": planted.reduction_reordered,
              "fused": fused.fused, "fused_o_proj_swapped": fused_bug(fused.o_proj_swapped),
              "fused_post_norm_is_pre_norm": fused_bug(fused.post_norm_is_pre_norm)}
    rows = []
    print(f"# {platform.node()} {os.cpu_count()} cpus, python {platform.python_version()}", file=sys.stderr)
    for name in args.candidates.split(","):
        b = makers[name](a, tmp / name)
        t = time.perf_counter()
        r = judge(a, b, ckpt, Options(seed=args.seed))
        wall = time.perf_counter() - t
        rows.append({"candidate": name, "wall_s": round(wall, 2), "verdict": r.verdict.status,
                     "kind": r.verdict.kind, "phases_s": {k: round(v, 2) for k, v in r.seconds.items()},
                     "workload": next(l for l in r.lines if l.startswith("workload:")), "line": r.verdict.line})
        print(f"{name:22s} {wall:6.1f} s  {r.verdict.line[:150]}", flush=True)
    if args.json:
        print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
