"""bench/serve_gpu.sh's summary: one JSON object of every server's rows (the lone stream, the
curve, the long prompts, start-up), and where matplotlib is installed a plot of output
throughput and TTFT p50 against concurrency, one line a server.

    python bench/serve_summary.py OUT_DIR [--plot PNG]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

LABELS = ("kern", "vllm", "transformers")  # serve_gpu.sh's; others are found by their start-up files


def labels(out: Path) -> list[str]:
    found = {p.name[:-len("_startup.json")] for p in out.glob("*_startup.json")}
    return [*LABELS, *sorted(found - set(LABELS))]


def rows(out: Path, label: str, kind: str) -> list[dict]:
    p = out / f"{label}{kind}.jsonl"
    if not p.is_file():
        return []
    keep = []
    for r in (json.loads(ln) for ln in p.read_text().splitlines() if ln.strip()):
        keep.append({"concurrency": r["concurrency"], "prompt": r.get("prompt_tokens"),
                     "completed": r["completed"], "failed": r["failed"], "out_tok_s": r["output_throughput"],
                     "ttft_ms": r["ttft_ms"], "tpot_ms": r["tpot_ms"], "itl_ms": r["itl_ms"],
                     "client_busy_max": r.get("client_cpu", {}).get("busy_max"),
                     **({"failures": r["failures"]} if r["failed"] else {})})
    return keep


def summary(out: Path) -> dict:
    doc = {"gpu": (out / "gpu.txt").read_text().strip() if (out / "gpu.txt").is_file() else None, "servers": {}}
    for label in labels(out):
        s = {"lone": rows(out, label, "_lone"), "curve": rows(out, label, ""), "long": rows(out, label, "_long")}
        up = out / f"{label}_startup.json"
        if up.is_file():
            s["startup_s"] = json.loads(up.read_text())["startup_s"]
        if any(s.values()):
            doc["servers"][label] = s
    return doc


def plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    for label, s in doc["servers"].items():
        curve = sorted(s["curve"], key=lambda r: r["concurrency"])
        if not curve:
            continue
        c = [r["concurrency"] for r in curve]
        a.plot(c, [r["out_tok_s"] for r in curve], marker="o", label=label)
        b.plot(c, [r["ttft_ms"]["p50"] for r in curve], marker="o", label=label)
    for ax, title in ((a, "output tokens/s"), (b, "TTFT p50 (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent streams")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
    b.set_yscale("log")
    fig.suptitle(f"Llama-3.2-1B shape, streamed chat (512-token prompts, 256 shared; 128 out), {doc['gpu'] or ''}",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--plot", type=Path, default=None, help="PNG to write (default: OUT/serve_curve.png)")
    args = ap.parse_args()
    doc = summary(args.out)
    try:
        plot(doc, args.plot or args.out / "serve_curve.png")
    except ImportError:
        pass
    print(json.dumps(doc))


if __name__ == "__main__":
    main()
