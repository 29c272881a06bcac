"""The serve workload's steps as the host loop plans them, no device needed: a closed loop of
--concurrency streams (a request's successor added as it ends) through kern.api.Model's loop,
on a seeded tiny Kimi-Linear checkpoint and its cpu deployment (made in --work), with decode
run ahead --run-ahead steps as on CUDA (the cpu's own default is 1). Each plan the scheduler
makes is recorded: runs ahead, single decode steps, mixed steps (prompt chunks beside decode
rows) and prompt-only steps, with their rows; and each request's steps from arrival to its first
token. The timing is the cpu's and says nothing; the plans are the host's logic, the same on a
device (only the ragged budget differs: the cpu deployment's is 256 rows, sm_90a's 2,048).

    python3 bench/loop_steps.py [--concurrency 32] [--requests 96] [--prompt 512] [--shared 256] [--output 128]

Prints a table and `RESULT {json}`. On a device the same question is answered by kern serve's
own trace (bench/trace_steps.py)."""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path


def kind(ahead: int, rows: list[int]) -> str:
    if ahead > 1:
        return "run ahead"
    prompt = any(n > 1 for n in rows)
    return "mixed" if prompt and any(n == 1 for n in rows) else "prompt" if prompt else "decode"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--requests", type=int, default=96)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--shared", type=int, default=256)
    ap.add_argument("--output", type=int, default=128)
    ap.add_argument("--run-ahead", type=int, default=8)
    ap.add_argument("--work", type=Path, default=Path("/tmp/kern-loop-steps"))
    args = ap.parse_args()
    if not 0 <= args.shared <= args.prompt or min(args.concurrency, args.requests, args.prompt, args.output) < 1:
        print("loop_steps: give --concurrency, --requests, --prompt and --output of at least 1, and --shared "
              "between 0 and --prompt", file=sys.stderr)
        return 2
    from kern.api import Model
    from kern.generation.params import SamplingParams
    from kern_models.kimi_linear.generator import generate
    from kern_models.kimi_linear.random_checkpoint import make

    context = 1 << (args.prompt + args.output).bit_length()
    ckpt, dep = args.work / "ckpt", args.work / f"dep-{context}"
    if not (ckpt / "config.json").exists():
        make("tiny", ckpt, max_positions=max(context, 2048))
    if not (dep / "manifest.json").exists():
        generate(json.loads((ckpt / "config.json").read_text()), dep, target="cpu", context=context)
    model = Model(dep / "manifest.json", ckpt, run_ahead=args.run_ahead, context=context)
    loop, vocab = model.loop, json.loads((ckpt / "config.json").read_text())["vocab_size"]
    plans: list[tuple[int, list[int]]] = []
    plan = loop.scheduler.next

    def record(host_draws):
        p = plan(host_draws)
        plans.append((p.ahead, [n for _, n in p.rows]))
        return p

    loop.scheduler.next = record
    shared = [(i * 104729) % (vocab - 1) + 1 for i in range(args.shared)]
    added, first, sent = {}, {}, 0
    params = SamplingParams(max_tokens=args.output, ignore_eos=True)

    def add():
        nonlocal sent
        rid = f"r{sent}"
        added[rid] = sum(a for a, _ in plans)
        loop.add(rid, shared + [(sent * 7919 + i * 31) % (vocab - 1) + 1 for i in range(args.prompt - args.shared)],
                 params)
        sent += 1

    for _ in range(min(args.concurrency, args.requests)):
        add()
    while loop.has_work():
        for d in loop.step():
            if d.token_ids and d.request_id not in first:
                first[d.request_id] = sum(a for a, _ in plans)
            if d.finish_reason and sent < args.requests:
                add()
    by = Counter()
    rows = Counter()
    for ahead, r in plans:
        k = kind(ahead, r)
        by[k] += ahead
        rows[k, "prompt"] += ahead * sum(n for n in r if n > 1)
        rows[k, "decode"] += ahead * sum(1 for n in r if n == 1)
    runs = sum(1 for a, _ in plans if a > 1)
    waits = sorted(first[r] - added[r] for r in first)
    out = {"steps": sum(by.values()), "ideal_steps": -(-args.requests * args.output // args.concurrency),
           "runs_ahead": runs, "by_kind": {k: {"steps": n, "prompt_rows_a_step": round(rows[k, "prompt"] / n, 1),
                                               "decode_rows_a_step": round(rows[k, "decode"] / n, 1)}
                                           for k, n in sorted(by.items())},
           "steps_to_first_token": {"p50": waits[len(waits) // 2], "p90": waits[len(waits) * 9 // 10], "max": waits[-1]}}
    print(f"{out['steps']} device steps (ideal at {args.concurrency} rows: {out['ideal_steps']}), {runs} runs ahead")
    for k, v in out["by_kind"].items():
        print(f"  {k:10} {v['steps']:6d} steps, {v['prompt_rows_a_step']:7.1f} prompt + {v['decode_rows_a_step']:5.1f} "
              "decode rows a step")
    print("steps from arrival to the first token: p50 {p50}, p90 {p90}, max {max}".format(**out["steps_to_first_token"]))
    print("RESULT " + json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
