"""Where a served run's wall time went, step by step, from a `kern serve --trace` file: each
program run a step (a decode run ahead k steps is k lines handed over at one instant, one run),
its kind (decode: every sequence one row; mixed: prompt chunks beside decode rows; prompt:
prompt chunks only), and the wall from its hand-over to the next run's (the device's time and
the host's around it; a gap past --idle-s is the server waiting for requests, left out).

    python3 bench/trace_steps.py TRACE [--from T] [--to T] [--idle-s 0.5]

--from / --to: the host's monotonic clock (a window of the trace, e.g. one concurrency level:
bench/hybrid_serve.py --trace records each level's). Prints a table a kind (runs, steps, ms a
step mean and p50, prompt and decode rows a step, share of the wall) and `RESULT {json}`.
Traces without times (before 2026-12-04) are refused in one line."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


def kind(rows: list[int]) -> str:
    prompt = any(n > 1 for n in rows)
    return "mixed" if prompt and any(n == 1 for n in rows) else "prompt" if prompt else "decode"


AT_ONCE_S = 2e-4  # a run's lines are written one after another as it is handed over: microseconds apart


def runs(lines: list[dict]) -> list[dict]:
    """Decode lines of one program, each a step past the one before (every start one on) and
    written at once: one run ahead of k steps."""
    out: list[dict] = []
    prev = None
    for ln in lines:
        last = out[-1] if out else None
        if (last is not None and last["kind"] == "decode" == kind(ln["rows"]) and last["program"] == ln["program"]
                and ln["t"] - prev["t"] < AT_ONCE_S and ln["start"] == [x + 1 for x in prev["start"]]):
            last["steps"] += 1
        else:
            out.append({"program": ln["program"], "t": ln["t"], "steps": 1, "kind": kind(ln["rows"]),
                        "prompt_rows": sum(n for n in ln["rows"] if n > 1),
                        "decode_rows": sum(1 for n in ln["rows"] if n == 1)})
        prev = ln
    return out


def summarize(lines: list[dict], t_from: float | None = None, t_to: float | None = None, idle_s: float = 0.5) -> dict:
    """Per kind: runs, steps, ms a step (mean, p50), rows a step, share of the timed wall."""
    sel = [ln for ln in lines if (t_from is None or ln["t"] >= t_from) and (t_to is None or ln["t"] <= t_to)]
    rs = runs(sel)
    by: dict[str, dict] = {}
    idle = timed = 0.0
    for a, b in zip(rs, rs[1:]):
        wall = b["t"] - a["t"]
        if wall > idle_s:
            idle += wall
            continue
        timed += wall
        k = by.setdefault(a["kind"], {"runs": 0, "steps": 0, "wall_s": 0.0, "per_step_ms": [], "prompt_rows": 0,
                                      "decode_rows": 0})
        k["runs"] += 1
        k["steps"] += a["steps"]
        k["wall_s"] += wall
        k["per_step_ms"].append(1e3 * wall / a["steps"])
        k["prompt_rows"] += a["prompt_rows"] * a["steps"]
        k["decode_rows"] += a["decode_rows"] * a["steps"]
    out = {"timed_s": round(timed, 3), "idle_s": round(idle, 3), "kinds": {}}
    for name, k in sorted(by.items()):
        ms = k.pop("per_step_ms")
        out["kinds"][name] = {"runs": k["runs"], "steps": k["steps"], "ms_a_step": round(1e3 * k["wall_s"] / k["steps"], 3),
                              "ms_a_step_p50": round(statistics.median(ms), 3),
                              "prompt_rows_a_step": round(k["prompt_rows"] / k["steps"], 1),
                              "decode_rows_a_step": round(k["decode_rows"] / k["steps"], 1),
                              "share": round(k["wall_s"] / timed, 3) if timed else 0.0}
    return out


def read(path: Path) -> list[dict]:
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    if not lines or lines[0].get("kern_trace") is None:
        raise SystemExit(f"trace_steps: {path}: not a kern serve trace (its first line holds \"kern_trace\")")
    steps = lines[1:]
    if any("t" not in ln for ln in steps):
        raise SystemExit(f"trace_steps: {path}: its steps carry no times (\"t\"): a trace from before 2026-12-04")
    return steps


def table(s: dict) -> str:
    head = f"{'kind':8} {'runs':>6} {'steps':>6} {'ms/step':>8} {'p50':>8} {'prompt':>7} {'decode':>7} {'share':>6}"
    rows = [f"{n:8} {k['runs']:6d} {k['steps']:6d} {k['ms_a_step']:8.2f} {k['ms_a_step_p50']:8.2f} "
            f"{k['prompt_rows_a_step']:7.1f} {k['decode_rows_a_step']:7.1f} {k['share']:6.1%}" for n, k in s["kinds"].items()]
    return "\n".join([head, *rows, f"timed {s['timed_s']} s, idle {s['idle_s']} s"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--from", dest="t_from", type=float, default=None)
    ap.add_argument("--to", dest="t_to", type=float, default=None)
    ap.add_argument("--idle-s", type=float, default=0.5)
    args = ap.parse_args()
    if not args.trace.is_file():
        print(f"trace_steps: {args.trace}: no such file", file=sys.stderr)
        return 2
    s = summarize(read(args.trace), args.t_from, args.t_to, args.idle_s)
    print(table(s))
    print("RESULT " + json.dumps(s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
