"""Where the wide decode program overtakes the gemv decode program: the device time of a decode
step of each program at each batch size both hold, on the GPU. The default build's wide program
runs the invariant split GEMMs (gemm.cu's *_split), `--no-batch-invariance`'s cuBLASLt; the gemv
program holds the generator's `seqs` sequences (8 by default, a bound measured against the
cuBLASLt wide program: docs/perf-history.md), up to 32 with --seqs 32 to price past it.

    python bench/crossover.py [--shape llama-3.2-1b] [--batch 1,4,8,12,16,24,32] [--reach 640] [--seqs 32]

A seeded random checkpoint at the shape's real sizes; every row on the loop's scratch page at
--reach positions (as far as a serve workload's rows reach). A step's time is that of a run of
--steps decode steps with one host wait (Engine.run_steps, the token fed back on the device),
divided by the steps: the device's time, the host's share spread thin. Prints a JSON line a
(program, batch) and a last line naming the smallest batch from which the wide program is faster."""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from kern_models.common.random_checkpoint import make


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="llama-3.2-1b")
    ap.add_argument("--batch", default="1,4,8,12,16,20,24,28,32")
    ap.add_argument("--reach", type=int, default=640)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--context", default="4096", help="deployment context bounds to compare, comma-separated")
    ap.add_argument("--programs", default=None, help="only these programs (default: every decode program)")
    ap.add_argument("--seqs", type=int, default=None,
                    help="the gemv decode program's sequences (the generator's seqs, at most 32; default its own)")
    ap.add_argument("--no-batch-invariance", dest="batch_invariant", action="store_false",
                    help="the build whose bytes depend on the batch (its wide program on cuBLASLt)")
    args = ap.parse_args()
    if args.seqs is not None and not 1 <= args.seqs <= 32:
        ap.error(f"--seqs {args.seqs}: the gemv decode program steps 1 to 32 sequences")
    for ctx in [int(c) for c in args.context.split(",")]:
        measure(args, ctx)


def measure(args, context: int) -> None:

    from kern.api import Model
    from kern_models.llama.generator import generate

    tmp = Path(tempfile.mkdtemp())
    ckpt = make(args.shape, tmp / "ckpt", device="cuda", max_positions=max(context, 8192))
    man = generate(json.loads((ckpt / "config.json").read_text()), tmp / "deploy", target="cuda", model=args.shape,
                   context=context, batch_invariant=args.batch_invariant, **({"seqs": args.seqs} if args.seqs else {}))
    model = Model(man, ckpt, state_budget=2 << 30)
    runner = model.loop.runner
    k = args.steps
    best: dict[int, dict[str, float]] = {}
    decoders = list(runner.decoders)
    for st in decoders:
        if args.programs and st.program not in args.programs.split(","):
            continue
        for n in [int(b) for b in args.batch.split(",")]:
            if n > st.groups_max:
                continue
            feeds = [runner.scratch_feed(args.reach - k, k)] * n
            runner.decoders = [st]  # this program whatever the batch (run_ahead takes the first that holds it)
            runner.sizes = runner.ahead_sizes = list(range(1, st.groups_max + 1))  # no padding: the batch as it is
            runner.run_ahead(feeds, k)  # capture
            t0 = time.perf_counter()
            for _ in range(args.repeats):
                runner.run_ahead(feeds, k)
            ms = (time.perf_counter() - t0) * 1e3 / (args.repeats * k)
            t0 = time.perf_counter()
            for _ in range(args.repeats):  # one step a host wait: the host's part included
                runner._launch(st, feeds, False)()
            one = (time.perf_counter() - t0) * 1e3 / args.repeats
            best.setdefault(n, {})[st.program] = ms
            print(json.dumps({"shape": args.shape, "context": context, "program": st.program, "batch": n,
                              "step_ms": round(ms, 3), "tok_s": round(n / ms * 1e3), "single_step_ms": round(one, 3)}),
                  flush=True)
    wide = decoders[-1].program
    over = [n for n, t in sorted(best.items()) if len(t) > 1 and t[wide] < min(v for p, v in t.items() if p != wide)]
    print(json.dumps({"shape": args.shape, "context": context, "wide_faster_from": over[0] if over else None,
                      "steps": best}))


if __name__ == "__main__":
    main()
