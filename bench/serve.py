"""Serving throughput and latency over HTTP: streamed chat completions against an OpenAI server.

    python bench/serve.py --url http://127.0.0.1:8000 --concurrency 32,128 [--label kern]
    python bench/serve.py --prepare CKPT_DIR   # give a random checkpoint the bench's chat template

The workload (the defaults): 256 requests, each a 512-token prompt whose first 256 tokens are
one system prompt all requests share, 128 output tokens, greedy; sent at each concurrency in
turn after a short warm-up. Prompts are words `w{i}` of the random checkpoints' word tokenizer
(one word, one token) and the chat template joins the messages with nothing added, so both
servers see the same token counts. Prints a JSON line per concurrency: request and output
throughput, TTFT, TPOT (per request, after its first token) and ITL (between streamed chunks
that carry text), each as mean/p50/p99 in milliseconds, and the clients' own CPU use.

The client must never be what limits the number: the concurrency is spread over --clients
processes (default: one per 16 streams, at most half the cores), each streaming over raw
asyncio HTTP/1.1 connections (kept alive) and parsing each event with json.loads (--client
openai: the official AsyncOpenAI instead, ~10x the CPU a chunk). `client_cpu` reports each
client process's CPU time over its wall time: near 1.0 means the client was the bottleneck."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from urllib.parse import urlsplit

# One message after another, nothing added: a prompt of n words is n tokens under any server.
TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
STREAMS_PER_CLIENT = 16


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


class Connection:
    """One kept-alive HTTP/1.1 connection that POSTs and reads a server-sent event stream."""

    def __init__(self, url: str):
        u = urlsplit(url)
        self.host, self.port, self.prefix = u.hostname, u.port or 80, u.path.rstrip("/")
        self.reader = self.writer = None

    async def stream(self, path: str, body: dict) -> tuple[list[float], int | None]:
        """POST body; (arrival time of each event that carries text, the usage's completion
        tokens). A connection the server closed is opened again."""
        if self.writer is None or self.reader.at_eof():
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        data = json.dumps(body).encode()
        self.writer.write(f"POST {self.prefix}{path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                          f"Content-Type: application/json\r\nAuthorization: Bearer bench\r\n"
                          f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
        head = (await self.reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        status = int(head[0].split()[1])
        headers = {k.strip().lower(): v.strip() for k, v in (h.split(":", 1) for h in head[1:] if ":" in h)}
        stamps, tokens, pending = [], None, b""
        async for piece in self._body(headers):
            if status != 200:
                pending += piece
                continue
            now = time.monotonic()
            pending += piece.replace(b"\r\n", b"\n")
            *events, pending = pending.split(b"\n\n")
            for ev in events:
                if not ev.startswith(b"data:") or ev[5:].strip() == b"[DONE]":
                    continue
                obj = json.loads(ev[5:])
                choices = obj.get("choices")
                if choices and (choices[0].get("delta") or {}).get("content"):
                    stamps.append(now)
                if obj.get("usage"):
                    tokens = obj["usage"]["completion_tokens"]
        if headers.get("connection", "").lower() == "close":
            await self.close()
        if status != 200:
            raise RuntimeError(f"HTTP {status}: {pending[:200].decode(errors='replace')}")
        return stamps, tokens

    async def _body(self, headers: dict):
        r = self.reader
        if headers.get("transfer-encoding", "").lower() == "chunked":
            while size := int((await r.readuntil(b"\r\n")).split(b";")[0], 16):
                yield (await r.readexactly(size + 2))[:-2]
            await r.readuntil(b"\r\n")
        elif "content-length" in headers:
            yield await r.readexactly(int(headers["content-length"]))
        else:
            while piece := await r.read(65536):
                yield piece

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.reader = self.writer = None


def request_body(model: str, messages: list[dict], output: int) -> dict:
    return {"model": model, "messages": messages, "max_tokens": output, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}


async def raw_one(conn: Connection, model: str, messages: list[dict], output: int) -> dict:
    t0 = time.monotonic()
    stamps, tokens = await conn.stream("/v1/chat/completions", request_body(model, messages, output))
    return {"start": t0, "end": time.monotonic(), "stamps": stamps,
            "tokens": tokens if tokens is not None else len(stamps)}


async def openai_one(client, model: str, messages: list[dict], output: int) -> dict:
    t0 = time.monotonic()
    stamps, tokens = [], None
    stream = await client.chat.completions.create(model=model, messages=messages, max_tokens=output, temperature=0,
                                                  stream=True, stream_options={"include_usage": True})
    async for ch in stream:
        if ch.choices and ch.choices[0].delta.content:
            stamps.append(time.monotonic())
        if getattr(ch, "usage", None) is not None:
            tokens = ch.usage.completion_tokens
    return {"start": t0, "end": time.monotonic(), "stamps": stamps,
            "tokens": tokens if tokens is not None else len(stamps)}


async def client_run(url: str, model: str, requests: list[list[dict]], concurrency: int, output: int,
                     kind: str) -> tuple[list[dict], list[str]]:
    """`concurrency` streams, each taking the next request when its last one ends."""
    todo = iter(requests)
    done, failures = [], []
    if kind == "openai":
        import openai

        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="bench", max_retries=0, timeout=900)

    async def lane():
        conn = Connection(url) if kind == "raw" else None
        for messages in todo:
            try:
                done.append(await (raw_one(conn, model, messages, output) if conn
                                   else openai_one(client, model, messages, output)))
            except Exception as e:  # noqa: BLE001 - a failed request is counted and named, not fatal
                failures.append(f"{type(e).__name__}: {e}"[:200])
                if conn:
                    await conn.close()
        if conn:
            await conn.close()

    await asyncio.gather(*(lane() for _ in range(min(concurrency, len(requests)))))
    if kind == "openai":
        await client.close()
    return done, failures


def client_process(url: str, model: str, requests: list[list[dict]], concurrency: int, output: int, kind: str,
                   start_at: float) -> dict:
    """One client process's share, started at `start_at` (time.monotonic, the same clock in
    every process): its results, failures, CPU seconds and wall seconds."""
    time.sleep(max(0.0, start_at - time.monotonic()))
    cpu0, t0 = time.process_time(), time.monotonic()
    done, failures = asyncio.run(client_run(url, model, requests, concurrency, output, kind))
    return {"done": done, "failures": failures, "cpu_s": time.process_time() - cpu0, "wall_s": time.monotonic() - t0}


def run(pool: ProcessPoolExecutor, clients: int, url: str, model: str, requests: list[list[dict]], concurrency: int,
        output: int, kind: str) -> dict:
    clients = max(1, min(clients, concurrency))
    start_at = time.monotonic() + 0.5
    jobs = [pool.submit(client_process, url, model, requests[k::clients],
                        concurrency // clients + (k < concurrency % clients), output, kind, start_at)
            for k in range(clients)]
    parts = [j.result() for j in jobs]
    done = [r for p in parts for r in p["done"]]
    failures = [f for p in parts for f in p["failures"]]
    wall = (max(r["end"] for r in done) - min(r["start"] for r in done)) if done else 0.0
    ttft = [r["stamps"][0] - r["start"] for r in done if r["stamps"]]
    tpot = [(r["end"] - r["stamps"][0]) / (r["tokens"] - 1) for r in done if r["stamps"] and r["tokens"] > 1]
    itl = [b - a for r in done for a, b in zip(r["stamps"], r["stamps"][1:])]
    out_tokens = sum(r["tokens"] for r in done)
    busy = [p["cpu_s"] / p["wall_s"] for p in parts if p["wall_s"] > 0]
    return {"concurrency": concurrency, "requests": len(requests), "completed": len(done),
            "failed": len(failures), "failures": failures[:3], "wall_s": round(wall, 3),
            "request_throughput": round(len(done) / wall, 3) if wall else 0.0,
            "output_throughput": round(out_tokens / wall, 1) if wall else 0.0,
            "output_tokens": out_tokens, "ttft_ms": summary(ttft), "tpot_ms": summary(tpot), "itl_ms": summary(itl),
            "client_cpu": {"clients": clients, "kind": kind, "busy_max": round(max(busy, default=0), 3),
                           "busy_mean": round(sum(busy) / len(busy), 3) if busy else 0,
                           "us_per_token": round(1e6 * sum(p["cpu_s"] for p in parts) / max(1, out_tokens), 1)}}


def model_of(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url + "/v1/models", timeout=60) as r:
        return json.load(r)["data"][0]["id"]


def default_clients(concurrency: int) -> int:
    return max(1, min(math.ceil(concurrency / STREAMS_PER_CLIENT), (os.cpu_count() or 2) // 2))


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
    ap.add_argument("--clients", type=int, default=None,
                    help=f"client processes (default: one per {STREAMS_PER_CLIENT} streams, at most half the cores)")
    ap.add_argument("--client", choices=("raw", "openai"), default="raw", help="the HTTP client each process runs")
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
    model = args.model or model_of(args.url)
    head = {"label": args.label, "url": args.url, "model": model, "prompt_tokens": args.prompt,
            "shared_tokens": args.shared, "output_tokens": args.output}
    levels = [int(x) for x in args.concurrency.split(",")]
    clients = {c: args.clients or default_clients(c) for c in levels}
    warm = [[{"role": "user", "content": words(rng, 16, args.vocab)}]] * args.warmup
    with ProcessPoolExecutor(max(clients.values()), mp_context=get_context("spawn")) as pool:
        if warm:
            run(pool, max(clients.values()), args.url, model, warm, len(warm), 8, args.client)
        for c in levels:  # a line each, so a timeout keeps the rest
            print(json.dumps({**head, **run(pool, clients[c], args.url, model, requests, c, args.output,
                                            args.client)}), flush=True)


if __name__ == "__main__":
    main()
