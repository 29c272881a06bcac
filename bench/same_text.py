"""Greedy text of fixed token prompts from an OpenAI-compatible server, one request at a time and
all at once, written as JSON; or two such files compared (bench/window_gpu.sh: `kern serve`
against vLLM with kern's forward pass, on one deployment).

    python bench/same_text.py --url http://127.0.0.1:8100 --out kern.json
    python bench/same_text.py --compare kern.json vllm_kern.json

The prompts are tests/hosts/test_vllm_gpu.py's: a short one, two sharing a 40-token prefix (a
prefix cache shares it), a 700-token one (chunked by a host that chunks) and a repeated token."""

from __future__ import annotations

import argparse
import json
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor

SHARED = [100 + i for i in range(40)]
PROMPTS = [[5, 9, 13], SHARED + [7, 8], SHARED + [11], list(range(300, 1000)), [42] * 17]


def complete(url: str, model: str, prompt: list[int], n: int) -> str:
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": n, "temperature": 0,
                       "ignore_eos": True}).encode()
    req = urllib.request.Request(f"{url}/v1/completions", body, {"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=120).read())["choices"][0]["text"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url")
    ap.add_argument("--out")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"))
    args = ap.parse_args()
    if args.compare:
        a, b = (json.load(open(f)) for f in args.compare)
        rows = {"same_alone": a["alone"] == b["alone"], "same_together": b["together"] == a["alone"],
                "a_batch_invariant": a["alone"] == a["together"], "b_batch_invariant": b["alone"] == b["together"],
                "prompts": len(a["alone"])}
        print(json.dumps({"compare": args.compare, **rows}))
        for i, (x, y) in enumerate(zip(a["alone"], b["alone"])):  # where they part, to read the cause
            if x != y:
                at = next((j for j, (u, v) in enumerate(zip(x, y)) if u != v), min(len(x), len(y)))
                print(f"prompt {i}: part at character {at}: {x[max(0, at - 20):at + 40]!r} / {y[max(0, at - 20):at + 40]!r}")
        return 0 if rows["same_alone"] and rows["same_together"] else 1
    if not (args.url and args.out):
        print("same_text.py: --url and --out, or --compare A B")
        return 2
    model = json.loads(urllib.request.urlopen(f"{args.url}/v1/models").read())["data"][0]["id"]
    alone = [complete(args.url, model, p, args.tokens) for p in PROMPTS]
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        together = list(pool.map(lambda p: complete(args.url, model, p, args.tokens), PROMPTS))
    json.dump({"url": args.url, "model": model, "alone": alone, "together": together}, open(args.out, "w"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
