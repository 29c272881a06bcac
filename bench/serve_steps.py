"""Where a served step's time goes, without HTTP: the host loop driven offline by the serve
workload (bench/serve.py's shape: each lane sends its next request the moment its last one
ends), every step timed and classed by what it ran.

    python bench/serve_steps.py CKPT [--concurrency 32,128] [--requests 256]

One process, the loop as kern serve builds it (no flags: the device's memory, every graph
captured first). Prints a JSON line a concurrency: output tok/s, TTFT p50 (from a request's
add to its first token), and for each kind of step (decode-only, run-ahead, with prefill
rows) how many there were, their rows and their time (mean, p50), plus the host's share of
the run-ahead steps (the time before the device's first token lands)."""

from __future__ import annotations

import argparse
import json
import random
import time
from collections import defaultdict


def drive(loop, concurrency: int, requests: int, prompt: int, shared: int, output: int, vocab: int, seed: int) -> dict:
    from kern.generation import SamplingParams

    r0 = random.Random(0)
    system = [r0.randrange(3, vocab) for _ in range(shared)]  # every run's, as in bench/serve.py
    rng = random.Random(seed)
    todo = [system + [rng.randrange(3, vocab) for _ in range(prompt - shared)] for _ in range(requests)]
    params = SamplingParams(max_tokens=output, ignore_eos=True)
    sent: dict[str, float] = {}
    first: dict[str, float] = {}
    made = 0
    steps: dict[str, list] = defaultdict(list)
    n = 0

    def send() -> None:
        nonlocal n
        if n < len(todo):
            rid = f"r{n}"
            loop.add(rid, todo[n], params)
            sent[rid] = time.perf_counter()
            n += 1

    for _ in range(concurrency):
        send()
    t_start = time.perf_counter()
    while loop.has_work():
        decode = sum(1 for s in loop.running if s.pending == 1)
        prefill = bool(loop.waiting) or any(s.pending > 1 for s in loop.running)
        t0 = time.perf_counter()
        landed: list[float] = []

        def emit(deltas, landed=landed):
            landed.append(time.perf_counter())
            seen(deltas)

        def seen(deltas) -> None:
            nonlocal made
            now = time.perf_counter()
            for d in deltas:
                if d.token_ids:
                    made += len(d.token_ids)
                    first.setdefault(d.request_id, now)
                if d.finish_reason is not None:
                    send()

        before = loop.stats().steps
        seen(loop.step(emit))
        dt = time.perf_counter() - t0
        ahead = loop.stats().steps - before
        kind = "ahead" if ahead > 1 else "prefill" if prefill else "decode"
        steps[kind].append((dt, ahead, decode, landed[0] - t0 if landed else None))
    wall = time.perf_counter() - t_start
    ttft = sorted(first[r] - sent[r] for r in first)
    out = {"concurrency": concurrency, "requests": requests, "out_tok_s": round(made / wall),
           "ttft_p50_ms": round(1e3 * ttft[len(ttft) // 2], 1), "ttft_p99_ms": round(1e3 * ttft[int(0.99 * len(ttft))], 1),
           "wall_s": round(wall, 2)}
    for kind, xs in steps.items():
        ts = sorted(x[0] for x in xs)
        out[kind] = {"count": len(xs), "ms_mean": round(1e3 * sum(ts) / len(ts), 3), "ms_p50": round(1e3 * ts[len(ts) // 2], 3),
                     "steps": sum(x[1] for x in xs), "decode_rows_mean": round(sum(x[2] for x in xs) / len(xs), 1)}
        firsts = sorted(x[3] for x in xs if x[3] is not None)
        if firsts:
            out[kind]["first_token_ms_p50"] = round(1e3 * firsts[len(firsts) // 2], 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpt")
    ap.add_argument("--concurrency", default="32,128")
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--shared", type=int, default=256)
    ap.add_argument("--output", type=int, default=128)
    ap.add_argument("--target", default="cuda")
    ap.add_argument("--context", type=int, default=None)
    ap.add_argument("--memory", type=int, default=None, help="GiB of state memory (default: kern's own choice)")
    ap.add_argument("--run-ahead", default=None, help="run-ahead limits to compare (default: the loop's own)")
    args = ap.parse_args()

    from dataclasses import replace

    import kern

    t0 = time.perf_counter()
    model = kern.load(args.ckpt, target=args.target, context=args.context,
                      state_budget=args.memory << 30 if args.memory else None)
    loop = model.loop
    loop.warm_up(progress=False)
    print(json.dumps({"load_and_capture_s": round(time.perf_counter() - t0, 1), "context": loop.context,
                      "max_seqs": loop.limits.max_seqs, "sizes": loop.runner.sizes}), flush=True)
    vocab = model.verified.constants["vocab"]
    drive(loop, 8, 16, args.prompt, args.shared, args.output, vocab, seed=99)  # the shared prefix cached, as bench/serve.py's warm-up
    for k in [int(x) for x in args.run_ahead.split(",")] if args.run_ahead else [loop.limits.run_ahead]:
        loop.limits = replace(loop.limits, run_ahead=k)
        for c in [int(x) for x in args.concurrency.split(",")]:
            r = drive(loop, c, args.requests, args.prompt, args.shared, args.output, vocab, seed=c)
            print(json.dumps({"run_ahead": k, **r}), flush=True)


if __name__ == "__main__":
    main()
