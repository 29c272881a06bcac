"""Serving throughput and latency over HTTP: streamed chat completions against an OpenAI server.

    python bench/serve.py --url http://127.0.0.1:8000 --concurrency 32,128 [--label kern]
    python bench/serve.py --prepare CKPT_DIR   # give a random checkpoint the bench's chat template

The workload (the defaults): 256 requests, each a 512-token prompt whose first 256 tokens are
one system prompt all requests share, 128 output tokens, greedy; sent by AsyncOpenAI at each
concurrency in turn after a short warm-up. Prompts are words `w{i}` of the random checkpoints'
word tokenizer (one word, one token) and the chat template joins the messages with nothing
added, so both servers see the same token counts. Prints a JSON line per concurrency: request
and output throughput, TTFT, TPOT (per request, after its first token) and ITL (between streamed
chunks), each as mean/p50/p99 in milliseconds."""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from pathlib import Path

# One message after another, nothing added: a prompt of n words is n tokens under any server.
TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"


def prepare(folder: Path) -> None:
    """Give a random checkpoint the chat template and no EOS (every request makes exactly
    --output tokens on both servers; neither is asked for a non-standard field)."""
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": TEMPLATE}))
    for name in ("config.json", "generation_config.json"):
        p = folder / name
        if p.is_file():
            cfg = json.loads(p.read_text())
            cfg["eos_token_id"] = None
            p.write_text(json.dumps(cfg, indent=2))


def words(rng: random.Random, n: int, vocab: int) -> str:
    return " ".join(f"w{rng.randrange(3, vocab)}" for _ in range(n))


def summary(values: list[float]) -> dict:
    if not values:
        return {"mean": None, "p50": None, "p99": None}
    v = sorted(values)

    def pct(q: float) -> float:
        return v[min(len(v) - 1, round(q * (len(v) - 1)))]

    return {"mean": round(1e3 * sum(v) / len(v), 2), "p50": round(1e3 * pct(0.5), 2), "p99": round(1e3 * pct(0.99), 2)}


async def one(client, model: str, messages: list[dict], output: int) -> dict:
    t0 = time.perf_counter()
    stamps, tokens = [], None
    stream = await client.chat.completions.create(model=model, messages=messages, max_tokens=output, temperature=0,
                                                  stream=True, stream_options={"include_usage": True})
    async for ch in stream:
        if ch.choices and ch.choices[0].delta.content:
            stamps.append(time.perf_counter())
        if getattr(ch, "usage", None) is not None:
            tokens = ch.usage.completion_tokens
    t1 = time.perf_counter()
    return {"start": t0, "end": t1, "stamps": stamps, "tokens": tokens if tokens is not None else len(stamps)}


async def run(url: str, model: str, requests: list[list[dict]], concurrency: int, output: int) -> dict:
    import openai

    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="bench", max_retries=0, timeout=900)
    gate = asyncio.Semaphore(concurrency)
    failures: list[str] = []

    async def gated(messages):
        async with gate:
            try:
                return await one(client, model, messages, output)
            except Exception as e:  # noqa: BLE001 - a failed request is counted and named, not fatal
                failures.append(f"{type(e).__name__}: {e}"[:200])
                return None

    t0 = time.perf_counter()
    done = [r for r in await asyncio.gather(*(gated(m) for m in requests)) if r is not None]
    wall = time.perf_counter() - t0
    await client.close()
    ttft = [r["stamps"][0] - r["start"] for r in done if r["stamps"]]
    tpot = [(r["end"] - r["stamps"][0]) / (r["tokens"] - 1) for r in done if r["stamps"] and r["tokens"] > 1]
    itl = [b - a for r in done for a, b in zip(r["stamps"], r["stamps"][1:])]
    out_tokens = sum(r["tokens"] for r in done)
    return {"concurrency": concurrency, "requests": len(requests), "completed": len(done),
            "failed": len(failures), "failures": failures[:3], "wall_s": round(wall, 3),
            "request_throughput": round(len(done) / wall, 3), "output_throughput": round(out_tokens / wall, 1),
            "output_tokens": out_tokens, "ttft_ms": summary(ttft), "tpot_ms": summary(tpot), "itl_ms": summary(itl)}


async def model_of(url: str) -> str:
    import openai

    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="bench", max_retries=2, timeout=60)
    try:
        return (await client.models.list()).data[0].id
    finally:
        await client.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", default=None, help="model name (default: the server's first /v1/models entry)")
    ap.add_argument("--label", default="server")
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--prompt", type=int, default=512, help="prompt tokens per request")
    ap.add_argument("--shared", type=int, default=256, help="of which a system prompt every request shares")
    ap.add_argument("--output", type=int, default=128, help="output tokens per request")
    ap.add_argument("--concurrency", default="32,128")
    ap.add_argument("--vocab", type=int, default=128256, help="words w3..w{vocab-1} make the prompts")
    ap.add_argument("--warmup", type=int, default=4, help="requests sent (and not timed) first")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prepare", metavar="CKPT_DIR", help="only prepare a random checkpoint folder and exit")
    args = ap.parse_args()
    if args.prepare:
        prepare(Path(args.prepare))
        return
    rng = random.Random(args.seed)
    system = words(rng, args.shared, args.vocab)
    requests = [[{"role": "system", "content": system},
                 {"role": "user", "content": words(rng, args.prompt - args.shared, args.vocab)}]
                for _ in range(args.requests)]
    model = args.model or asyncio.run(model_of(args.url))
    head = {"label": args.label, "url": args.url, "model": model, "prompt_tokens": args.prompt,
            "shared_tokens": args.shared, "output_tokens": args.output}
    warm = [[{"role": "user", "content": words(rng, 16, args.vocab)}]] * args.warmup
    if warm:
        asyncio.run(run(args.url, model, warm, len(warm), 8))
    for c in (int(x) for x in args.concurrency.split(",")):  # a line each, so a timeout keeps the rest
        print(json.dumps({**head, **asyncio.run(run(args.url, model, requests, c, args.output))}), flush=True)

if __name__ == "__main__":
    main()
