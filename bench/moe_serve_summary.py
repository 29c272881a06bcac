"""bench/moe_serve_gpu.sh's summary of the HTTP measurements in one or more folders: per
server, the decode rate at each concurrency (streams / TPOT p50: every stream decodes at once)
and the serving rows (output tok/s, TTFT and TPOT p50), and kern's ratio to vLLM where both ran.

    python bench/moe_serve_summary.py DIR [DIR ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

from serve_summary import rows


def summary(dirs: list[Path]) -> dict:
    """{server: {"decode": {c: tok/s}, "serve": {c: row}}} of every folder's JSON lines."""
    out: dict = {}
    for d in dirs:
        for label in ("kern", "vllm"):
            s = out.setdefault(label, {"decode": {}, "serve": {}})
            for r in rows(d, label, "_decode"):
                if r["tpot_ms"]["p50"]:
                    s["decode"][r["concurrency"]] = round(r["concurrency"] * 1e3 / r["tpot_ms"]["p50"], 1)
            for r in rows(d, label, "_serve"):
                s["serve"][r["concurrency"]] = r
    return {k: v for k, v in out.items() if v["decode"] or v["serve"]}


def lines(doc: dict) -> list[str]:
    out = []
    for label, s in doc.items():
        for c, v in sorted(s["decode"].items()):
            out.append(f"{label:5s} decode over HTTP, {c:3d} streams: {v:9.1f} tok/s (streams / TPOT p50)")
        for c, r in sorted(s["serve"].items()):
            out.append(f"{label:5s} serving c={c:3d}: {r['out_tok_s']:9.1f} output tok/s  TTFT p50 "
                       f"{r['ttft_ms']['p50']} ms  TPOT p50 {r['tpot_ms']['p50']} ms  "
                       f"{r['completed']} done, {r['failed']} failed")
    k, v = doc.get("kern"), doc.get("vllm")
    if k and v:
        for c in sorted(set(k["serve"]) & set(v["serve"])):
            out.append(f"kern / vllm serving c={c}: {k['serve'][c]['out_tok_s'] / v['serve'][c]['out_tok_s']:.2f}x")
        for c in sorted(set(k["decode"]) & set(v["decode"])):
            out.append(f"kern / vllm decode over HTTP, {c} streams: {k['decode'][c] / v['decode'][c]:.2f}x")
    return out


if __name__ == "__main__":
    print("\n".join(lines(summary([Path(a) for a in sys.argv[1:]]))))
