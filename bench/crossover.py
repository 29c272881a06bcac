"""Where the wide decode program (cuBLASLt GEMMs) overtakes the gemv decode program: the device
time of a decode step of each program at each batch size both hold, on the GPU.

    python bench/crossover.py [--shape llama-3.2-1b] [--batch 1,4,8,12,16,24,32] [--reach 640]

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

from kern_models.llama.random_checkpoint import make


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="llama-3.2-1b")
    ap.add_argument("--batch", default="1,4,8,12,16,20,24,28,32")
    ap.add_argument("--reach", type=int, default=640)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()

    from kern.api import Model
    from kern_models.llama.generator import generate

    tmp = Path(tempfile.mkdtemp())
    ckpt = make(args.shape, tmp / "ckpt", device="cuda")
    man = generate(json.loads((ckpt / "config.json").read_text()), tmp / "deploy", target="cuda", model=args.shape,
                   context=4096)
    model = Model(man, ckpt, state_budget=2 << 30)
    runner = model.loop.runner
    k = args.steps
    best: dict[int, dict[str, float]] = {}
    for st in runner.decoders:
        for n in [int(b) for b in args.batch.split(",")]:
            if n > st.groups_max:
                continue
            feeds = [runner.scratch_feed(args.reach - k)] * n
            runner.stepper_for = lambda f, st=st: st  # this program whatever the batch
            runner.sizes = list(range(1, st.groups_max + 1))  # no padding: the batch as it is
            runner.run_ahead(feeds, k)  # capture
            t0 = time.perf_counter()
            for _ in range(args.repeats):
                runner.run_ahead(feeds, k)
            ms = (time.perf_counter() - t0) * 1e3 / (args.repeats * k)
            best.setdefault(n, {})[st.program] = ms
            print(json.dumps({"shape": args.shape, "program": st.program, "batch": n, "step_ms": round(ms, 3),
                              "tok_s": round(n / ms * 1e3)}), flush=True)
    wide = runner.decoders[-1].program
    over = [n for n, t in sorted(best.items()) if len(t) > 1 and t[wide] < min(v for p, v in t.items() if p != wide)]
    print(json.dumps({"shape": args.shape, "wide_faster_from": over[0] if over else None, "steps": best}))


if __name__ == "__main__":
    main()
