"""Speculative decoding against kern's own plain decoding, one stream, the embedded model (chat):

  editing      a prompt holds a source file (bench/speculative/*.py.txt) and asks for it back
               with one identifier renamed: the answer repeats the prompt (n-gram's case)
  summarising  a prompt holds a paragraph of prose (bench/speculative/*.txt) and asks for a
               three-sentence summary: little to look up

    python bench/speculative.py [--speculate ngram:8] [--workload editing,summarising]
                                [--max-tokens N] [--json OUT] [--target cuda]
    python bench/speculative.py --url http://127.0.0.1:8000 --label vllm   (any OpenAI server)

In-process (no --url): the model loaded twice, plainly and with --speculate, each prompt
decoded greedily by both with their steps alternating (both see the same machine, however
busy); the tokens must be the same (checked), and a workload's figure is its tokens over its
decode time (the steps after the first token), plain and speculative, and their ratio, with
the rounds' acceptance and tokens per round. With
--url: the same prompts streamed one at a time to a server's /v1/chat/completions (greedy), a
workload's output tokens over the time from each first token to its last. One JSON line a
workload."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent / "speculative"
EDITS = {"sequence.py.txt": ("Sequence", "Request"), "detok.py.txt": ("TextStream", "TokenText"),
         "outputs.py.txt": ("Delta", "Update")}
PROSE = ("lighthouses.txt", "water.txt", "bread.txt")
MAX_TOKENS = {"editing": 512, "summarising": 160}  # editing: room for the whole file back


def prompts(workload: str) -> list[str]:
    if workload == "editing":
        return [f"Here is a Python file:\n```python\n{(HERE / name).read_text()}```\nReturn the complete file with "
                f"one change: rename `{old}` to `{new}` everywhere. Reply with the code only."
                for name, (old, new) in EDITS.items()]
    return [f"Summarise the following text in three sentences.\n\n{(HERE / name).read_text()}" for name in PROSE]


def in_process(args) -> list[dict]:
    import kern
    from kern.generation import SamplingParams

    # two loads of the model, one speculating: their steps alternate, so that both see the same
    # machine (on a shared machine the load changes from minute to minute)
    kw = dict(target=args.target, context=args.context)
    if args.target != "cpu":  # two models on one GPU: a state budget each, not 90% of the device each
        kw["state_budget"] = 2 << 30
    plain, fast = kern.load(**kw), kern.load(**kw, speculate=args.speculate)
    for model in (plain, fast):  # a lone stream's graphs (decode at each reach, rounds of each width)
        model.loop.warm_up(sizes=[1], reach=args.context, progress=False)
    rows = []
    for workload in args.workload.split(","):
        n = args.max_tokens or MAX_TOKENS[workload]
        took = {"plain": [0, 0.0], "spec": [0, 0.0]}  # tokens after the first, seconds after the first
        same = True
        before = replace(fast.loop.speculator.stats)
        for i, text in enumerate(prompts(workload)[:args.prompts]):
            ids = plain._ids(text, True)
            got = {}
            for label, model in (("plain", plain), ("spec", fast)):
                model.loop.add(f"{workload}{i}", ids, SamplingParams(max_tokens=n))
                got[label] = []
            while plain.loop.has_work() or fast.loop.has_work():
                for label, model in (("plain", plain), ("spec", fast)):
                    if not model.loop.has_work():
                        continue
                    t0 = time.perf_counter()
                    deltas = model.loop.step()
                    dt = time.perf_counter() - t0
                    new = [t for d in deltas for t in d.token_ids]
                    if got[label]:  # decode: the steps after the first token
                        took[label][0] += len(new)
                        took[label][1] += dt
                    got[label] += new
            same &= got["plain"] == got["spec"]
            print(f"[bench] {workload} {i}: {len(got['plain'])} tokens, same tokens {got['plain'] == got['spec']}",
                  file=sys.stderr)
        sp = fast.loop.speculator.stats
        rounds, proposed, accepted, made = (sp.rounds - before.rounds, sp.proposed - before.proposed,
                                            sp.accepted - before.accepted, sp.tokens - before.tokens)
        a, b = took["plain"][0] / took["plain"][1], took["spec"][0] / took["spec"][1]
        rows.append({"workload": workload, "speculate": args.speculate, "prompts": min(args.prompts, 3),
                     "max_tokens": n, "plain_tok_s": round(a, 2), "spec_tok_s": round(b, 2), "ratio": round(b / a, 3),
                     "acceptance": round(accepted / proposed, 3) if proposed else 0,
                     "tokens_per_round": round(made / rounds, 2) if rounds else 0, "same_tokens": same})
    return rows


def over_http(args) -> list[dict]:
    import urllib.request

    model = json.loads(urllib.request.urlopen(f"{args.url}/v1/models").read())["data"][0]["id"]
    rows = []
    for workload in args.workload.split(","):
        n = args.max_tokens or MAX_TOKENS[workload]
        tokens, secs = 0, 0.0
        for text in prompts(workload)[:args.prompts]:
            body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": n,
                    "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
            req = urllib.request.Request(f"{args.url}/v1/chat/completions", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
            first = last = None
            used = 0
            with urllib.request.urlopen(req) as r:
                for line in r:
                    if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    if chunk.get("usage"):
                        used = chunk["usage"]["completion_tokens"]
                    if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                        last = time.perf_counter()
                        first = first or last
            tokens += max(used - 1, 0)  # tokens after the first, over the time from the first to the last
            secs += (last - first) if first else 0.0
        rows.append({"workload": workload, "label": args.label, "prompts": min(args.prompts, 3), "max_tokens": n,
                     "tok_s": round(tokens / secs, 2) if secs else 0.0})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--speculate", default="ngram:8")
    ap.add_argument("--workload", default="editing,summarising")
    ap.add_argument("--max-tokens", type=int, default=None, help="per prompt (default: editing 512, summarising 160)")
    ap.add_argument("--prompts", type=int, default=3, help="prompts of each workload (at most 3)")
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--target", default="cpu", help="in-process: where the model runs (cpu, cuda)")
    ap.add_argument("--url", default=None, help="measure this OpenAI-compatible server instead")
    ap.add_argument("--label", default="server")
    ap.add_argument("--json", default=None, help="append the JSON lines to this file too")
    args = ap.parse_args()
    rows = over_http(args) if args.url else in_process(args)
    for row in rows:
        line = json.dumps(row)
        print(line)
        if args.json:
            with open(args.json, "a") as f:
                f.write(line + "\n")


if __name__ == "__main__":
    main()
