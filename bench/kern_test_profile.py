"""Where kern test's reference-side seconds go: each phase of judging B against A run alone, in
sequence, in this process (no forked children), under cProfile.

    python bench/kern_test_profile.py --reference A --candidate B --weights CKPT [--top 25] [--plain]

Prints the machine's CPUs, then per phase (load A, record A, A's noise replay, A's floor replay
in B's precision, A's end-to-end floor, A free, and where B has a wide decode A free and in B's
precision on the wide workload) its wall seconds and its top functions by own time (--plain:
seconds only, no profiler), BLAS on one thread as kern test runs it. B is only diffed, never
loaded: this is the reference's half of the verdict; forked (4 cores or more) these phases run
side by side, so the longest of them, not their sum, is what the verdict waits for."""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time

import numpy as np


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reference", required=True)
    ap.add_argument("--candidate", required=True)
    ap.add_argument("--weights", required=True)
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--plain", action="store_true", help="seconds only, without the profiler")
    args = ap.parse_args()

    from kern.drive import script
    from kern.drive.engine_io import EngineIO
    from kern.judge import blas, corpus, precision, workloads
    from kern.judge.diff import diff
    from kern.judge.judge import Options, _floors
    from kern.judge.record import record
    from kern.judge.replay import free_run, replay
    from kern.manifest.verify import verify_path
    from kern.runtime.engine import Engine

    aff = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "?"
    print(f"# cpus {os.cpu_count()}, affinity {aff}, load {os.getloadavg()}, "
          f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', '-')}", flush=True)
    v_a, v_b = verify_path(args.reference).verified, verify_path(args.candidate).verified
    d, prec = diff(v_a, v_b), precision.of(v_a, v_b)
    opts = Options()
    state: dict = {}

    def load():
        state["io"] = EngineIO(Engine(v_a, args.weights))
        state["wide"] = workloads.wide(v_a, v_b, workloads.limits(state["io"], opts, v_b), opts,
                                       corpus.tokens(args.weights))
        state["wl"] = script.make(opts.seed, workloads.limits(state["io"], opts, v_b), seqs=opts.seqs,
                                    decode_steps=opts.decode_steps, corpus=corpus.tokens(args.weights), mixed=True)

    phases = [
        ("load_a", load),
        ("record_a", lambda: state.__setitem__("rec", record(state["io"], d, state["wl"], prec.carried))),
        ("noise", lambda: replay(state["io"], "a", d, state["rec"], prec)),
        ("floor", lambda: replay(state["io"], "a", d, state["rec"], prec, np.random.Generator(np.random.PCG64(0)))),
        ("floor_e2e", lambda: _floors(state["io"], prec, state["wl"], 1)),
        ("free_a", lambda: free_run(state["io"], state["wl"])),
        ("wide_a", lambda: state["wide"] and free_run(state["io"], state["wide"])),
        ("wide_floor", lambda: state["wide"] and _floors(state["io"], prec, state["wide"], 2)),
    ]
    total = 0.0
    with blas.threads(1):  # as kern test runs them
        for name, fn in phases:
            pr = cProfile.Profile()
            t = time.perf_counter()
            if not args.plain:
                pr.enable()
            fn()
            pr.disable()
            dt = time.perf_counter() - t
            total += dt
            if args.plain:
                print(f"## {name}: {dt:.2f} s", flush=True)
                continue
            out = io.StringIO()
            pstats.Stats(pr, stream=out).sort_stats("tottime").print_stats(args.top)
            body = [ln for ln in out.getvalue().splitlines() if ln.strip()][-args.top - 1:]
            print(f"## {name}: {dt:.2f} s", *body, sep="\n", flush=True)
    print(f"# phases {total:.2f} s; {state['wl'].describe()}; {len(state['rec'].records)} span records")
    return 0


if __name__ == "__main__":
    sys.exit(main())
