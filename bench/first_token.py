"""`kern run` as a new user meets it: wall time from the command to its first streamed byte, and
the decode tok/s it reports, on a first (cold cache) and on later (warm cache) runs.

    python bench/first_token.py --runs 3 --max-tokens 256 [--target cuda] [-- extra kern run flags]

Each run is a fresh process (`python -m kern.cli run ...`), so a warm run pays what a user pays:
the interpreter, the imports, the deployment lookup, the weights' upload and any graph capture.
The first run is cold only if KERN_CACHE starts empty (the embedded model is then converted from
its GGUF and the deployment generated). Prints one JSON object per run, then a summary line.
The peer for the decode figure is bench/decode.py's batch-1 engine loop on the same shapes, run
beside this in the same device call (bench/gpu.py --preset embedded)."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

DECODE = re.compile(r"decode (\d+) tokens: ([0-9.]+) tok/s")
PREFILL = re.compile(r"prefill (\d+) tokens: ([0-9.]+) tok/s")


def one_run(flags: list[str]) -> dict:
    """Start `kern run`, time its first stdout byte and its exit; parse its tok/s line."""
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-m", "kern.cli", "run", *flags], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=os.environ)
    first = p.stdout.read(1)
    t_first = time.perf_counter() - t0
    rest = p.stdout.read()
    err = p.stderr.read().decode(errors="replace")
    rc = p.wait()
    total = time.perf_counter() - t0
    d, f = DECODE.search(err), PREFILL.search(err)
    return {"rc": rc, "first_byte_s": round(t_first, 3) if first else None, "wall_s": round(total, 3),
            "decode_tokens": int(d.group(1)) if d else None, "decode_tok_s": float(d.group(2)) if d else None,
            "prefill_tokens": int(f.group(1)) if f else None,
            "text_head": (first + rest).decode(errors="replace")[:80],
            **({"stderr_tail": err.strip().splitlines()[-3:]} if rc else {})}


def api_runs(a) -> None:
    """The Python API in one process: kern.load() once, then generate twice (the first pays any
    capture the second reuses)."""
    import kern

    t0 = time.perf_counter()
    model = kern.load(target=a.target or "cpu")
    print(json.dumps({"api_load_s": round(time.perf_counter() - t0, 3)}), flush=True)
    for i in range(2):
        t0 = time.perf_counter()
        out = model.generate(a.prompt, chat=True, max_tokens=a.max_tokens)
        print(json.dumps({"api_generate": i + 1, "wall_s": round(time.perf_counter() - t0, 3),
                          "decode_tokens": len(out.tokens), "decode_tok_s": round(out.decode_tok_s, 1),
                          "prefill_s": round(out.prefill_s, 4)}), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--prompt", default="Write a long story about a dragon who learns to sing.")
    ap.add_argument("--target", default=None)
    ap.add_argument("extra", nargs="*", help="more kern run flags (after --)")
    ap.add_argument("--api", action="store_true", help="also kern.load().generate twice in this process")
    a = ap.parse_args()
    flags = ["--chat", "--prompt", a.prompt, "--max-tokens", str(a.max_tokens), *a.extra]
    if a.target:
        flags += ["--target", a.target]
    runs = []
    for i in range(a.runs):
        r = {"run": i + 1, **one_run(flags)}
        runs.append(r)
        print(json.dumps(r), flush=True)
    if a.api:
        api_runs(a)
    ok = [r for r in runs if r["rc"] == 0]
    if ok:
        print(f"first_token summary: first run {ok[0]['first_byte_s']} s to first byte, "
              f"{ok[0]['decode_tok_s']} tok/s decode; later runs "
              f"{[r['first_byte_s'] for r in ok[1:]]} s, {[r['decode_tok_s'] for r in ok[1:]]} tok/s")
    return 0 if len(ok) == len(runs) else 1


if __name__ == "__main__":
    sys.exit(main())
