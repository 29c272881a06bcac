"""bench/multi_gpu_serve.sh's summary (issue 41): every server's serve-workload figures as one
JSON line a server and concurrency (output tok/s, TTFT p50, ITL p50) in DIR/serve_rows.jsonl,
and DIR/summary.json: those rows, the ratios of each pair (kern --tp 2 / vLLM
--tensor-parallel-size 2, kern --ep 2 / vLLM with expert parallel, kern --pp 2 / kern on one
GPU) at each concurrency both ran, the start-ups, the multi_gpu.py steps' rows (tests, tp, ep,
ep_bench, pp) and the pipeline's notes. Prints a line a figure for a person.

    python bench/multi_gpu_summary.py DIR
    python bench/multi_gpu_summary.py --last DIR/LABEL.jsonl     a server's latest line, in a few words

A ratio is candidate / baseline of the same figure: above 1 is better for output tok/s, below 1
for TTFT and ITL. Rows whose requests failed stay in the rows (with `failed`) and are left out
of the ratios.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

# case: candidate label, baseline label (bench/multi_gpu_serve.sh's labels; <label>.jsonl holds
# bench/serve.py's lines of that server)
CASES = {
    "tp": ("kern_tp2", "vllm_tp2"),
    "ep": ("kern_ep2", "vllm_ep2"),
    "pp": ("kern_pp2", "kern_pp1"),
}
WHAT = {
    "tp": "kern serve --tp 2 / vLLM 0.26 --tensor-parallel-size 2, Llama-3.1-8B shape",
    "ep": "kern serve --ep 2 / vLLM 0.26 --tensor-parallel-size 2 --enable-expert-parallel, Qwen3-30B-A3B shape",
    "pp": "kern serve --pp 2 / kern serve on one GPU, Llama-3.1-8B shape",
}
# issue 41, item 1: kern serve --tp 2 at 32 and 128 streams >= 1.3x vLLM --tensor-parallel-size 2
TARGETS = {"tp": 1.3}
STEP_FILES = ("tests", "tp", "ep", "ep_bench", "pp")  # multi_gpu.py's steps: DIR/mg_<step>/summary.json


def row(label: str, r: dict) -> dict:
    """One bench/serve.py line as the compact row: output tok/s, TTFT p50, ITL p50 (ms)."""
    out = {"server": label, "concurrency": r["concurrency"], "completed": r["completed"], "failed": r["failed"],
           "out_tok_s": r["output_throughput"], "ttft_p50_ms": r["ttft_ms"]["p50"], "itl_p50_ms": r["itl_ms"]["p50"]}
    if r["failed"]:
        out["failures"] = r.get("failures", [])[:2]
    return out


def rows(folder: Path) -> list[dict]:
    """Every server's rows, in CASES' order (a server's last line at a concurrency wins)."""
    out = []
    for case, labels in CASES.items():
        for label in labels:
            p = folder / f"{label}.jsonl"
            if not p.is_file():
                continue
            got: dict[int, dict] = {}
            for ln in p.read_text().splitlines():
                try:
                    r = json.loads(ln)
                except ValueError:
                    continue
                if isinstance(r, dict) and "output_throughput" in r:
                    got[r["concurrency"]] = {"case": case, **row(label, r)}
            out += [got[c] for c in sorted(got)]
    return out


def _ratio(a, b) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def ratios(rs: list[dict]) -> dict:
    """{case: {concurrency: {out_tok_s, ttft_p50, itl_p50 (candidate / baseline), the pair's
    figures, the target and whether it is met}}} where both servers completed every request."""
    by = {(r["server"], r["concurrency"]): r for r in rs}
    out: dict = {}
    for case, (cand, base) in CASES.items():
        for c in sorted({r["concurrency"] for r in rs if r["server"] == cand}):
            a, b = by.get((cand, c)), by.get((base, c))
            if not a or not b or a["failed"] or b["failed"]:
                continue
            v = {"out_tok_s": _ratio(a["out_tok_s"], b["out_tok_s"]),
                 "ttft_p50": _ratio(a["ttft_p50_ms"], b["ttft_p50_ms"]),
                 "itl_p50": _ratio(a["itl_p50_ms"], b["itl_p50_ms"]),
                 cand: {k: a[k] for k in ("out_tok_s", "ttft_p50_ms", "itl_p50_ms")},
                 base: {k: b[k] for k in ("out_tok_s", "ttft_p50_ms", "itl_p50_ms")}}
            if case in TARGETS:
                v["target"] = TARGETS[case]
                v["met"] = v["out_tok_s"] is not None and v["out_tok_s"] >= TARGETS[case]
            out.setdefault(case, {})[str(c)] = v
    return out


def startups(folder: Path) -> dict:
    out = {}
    for p in sorted(folder.glob("*_startup.json")):
        try:
            out[p.name[:-len("_startup.json")]] = json.loads(p.read_text())["startup_s"]
        except (ValueError, KeyError):
            continue
    return out


def steps(folder: Path) -> dict:
    """multi_gpu.py's step rows, from each DIR/mg_<step>/summary.json its --device run wrote."""
    out = {}
    for step in STEP_FILES:
        p = folder / f"mg_{step}" / "summary.json"
        if p.is_file():
            doc = json.loads(p.read_text())
            for name, s in doc.get("steps", {}).items():
                out[name] = {**s, "notes": doc.get("notes", [])}
    return out


def summary(folder: Path) -> dict:
    rs = rows(folder)
    notes = folder / "progress.log"
    gpu = folder / "gpu.txt"
    return {"what": WHAT, "gpu": gpu.read_text().strip() if gpu.is_file() else None, "rows": rs,
            "ratios": ratios(rs), "startup_s": startups(folder), "steps": steps(folder),
            "progress": notes.read_text().splitlines() if notes.is_file() else []}


def lines(doc: dict) -> list[str]:
    out = []
    for r in doc["rows"]:
        out.append(f"{r['server']:9s} c={r['concurrency']:3d}: {r['out_tok_s']:9.1f} output tok/s  TTFT p50 "
                   f"{r['ttft_p50_ms']} ms  ITL p50 {r['itl_p50_ms']} ms  ({r['completed']} done, {r['failed']} failed)")
    for case, by_c in doc["ratios"].items():
        for c, v in by_c.items():
            met = f"  (target {v['target']}x: {'met' if v['met'] else 'NOT met'})" if "target" in v else ""
            out.append(f"{case} c={c}: {v['out_tok_s']}x output tok/s, TTFT p50 {v['ttft_p50']}x, ITL p50 "
                       f"{v['itl_p50']}x  [{WHAT[case]}]{met}")
    for label, s in doc["startup_s"].items():
        out.append(f"{label} start-up {s} s")
    for r in doc["steps"].get("ep_bench", {}).get("rows", []):
        if "all_to_all_share" in r:
            out.append(f"ep_bench {r['groups']} x 1 @ {r['context']}: all-to-all ({', '.join(r['all_to_all_ops'])}) "
                       f"{r['all_to_all_us']} us, {r['all_to_all_share']} of the calls a rank; EP=2 step "
                       f"{r['ep2_step_us']} us, EP=1 {r['ep1_step_us']} us")
    for name, s in doc["steps"].items():
        out.append(f"step {name}: {s.get('last_line', '')[:200]}")
    return out


def last(path: Path) -> str:
    """A server's latest bench/serve.py line in a few words (the pipeline's progress log)."""
    try:
        r = row("", json.loads(path.read_text().splitlines()[-1]))
    except (OSError, ValueError, IndexError, KeyError):
        return "no result"
    return (f"{r['out_tok_s']} output tok/s, TTFT p50 {r['ttft_p50_ms']} ms, ITL p50 {r['itl_p50_ms']} ms, "
            f"{r['completed']} done, {r['failed']} failed")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path, nargs="?")
    ap.add_argument("--last", type=Path, help="only a <label>.jsonl's latest line, in a few words")
    args = ap.parse_args()
    if args.last:
        print(last(args.last))
        return
    if args.folder is None:
        ap.error("give the folder (or --last FILE)")
    doc = summary(args.folder)
    (args.folder / "serve_rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in doc["rows"]))
    (args.folder / "summary.json").write_text(json.dumps(doc, indent=1) + "\n")
    print("\n".join(lines(doc)))


if __name__ == "__main__":
    main()
