"""What kern serve's API process costs a token, on any machine: the real server (engine process,
pipe, routing, SSE, HTTP) over a fake engine that steps its sequences on a timer, driven by
bench/serve.py's client processes.

    python bench/serve_cpu.py [--step-ms 8] [--concurrency 128] [--requests 256] [--clients 2]

The fake loop makes one token per running sequence per step and sleeps --step-ms a step, as a
host waits on a GPU (128 sequences at 8 ms a step: 16,000 tokens/s asked of the server). It
prints one JSON line: output tok/s and latencies as bench/serve.py measures them, and CPU
microseconds per output token of the API process, of the engine process and of the clients.
The API process's number is the one that bounds the server: at 15,000 tokens/s it has 66 us a
token in all. No GPU, no model: the fake's own host cost is a few microseconds a token."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from multiprocessing import get_context
from pathlib import Path

import serve as client  # (bench/serve.py, beside this script)

VOCAB = 4096


class FakeLoop:
    """The Loop's interface; every running sequence gets one token a step, after --step-ms."""

    model_name, context = "fake", 4096

    def __init__(self, folder: str, step_s: float, max_seqs: int):
        from kern.tokenizer import Tokenizer

        self.tokenizer = Tokenizer(folder)
        self.step_s, self.max_seqs = step_s, max_seqs
        self.waiting: deque = deque()
        self.running: dict[str, list[int]] = {}  # request id -> [prompt tokens, max tokens, made]
        self.steps = self.prompt_tokens = 0

    def add(self, request_id, prompt_ids, params):
        self.waiting.append((request_id, [len(prompt_ids), params.max_tokens, 0]))
        self.prompt_tokens += len(prompt_ids)

    def abort(self, request_id):
        self.running.pop(request_id, None)
        self.waiting = deque(w for w in self.waiting if w[0] != request_id)

    def has_work(self):
        return bool(self.waiting or self.running)

    def step(self, emit=None):
        from kern.generation.outputs import Delta

        while self.waiting and len(self.running) < self.max_seqs:
            rid, seq = self.waiting.popleft()
            self.running[rid] = seq
        time.sleep(self.step_s)
        self.steps += 1
        out = []
        for rid, seq in list(self.running.items()):
            seq[2] += 1
            tok = 3 + (self.steps * 7 + seq[2]) % (VOCAB - 3)
            finish = "length" if seq[2] >= seq[1] else None
            out.append(Delta(rid, (tok,), f" w{tok}", (), finish, seq[0], 0, seq[2]))
            if finish:
                del self.running[rid]
        return out

    def stats(self):
        from kern.generation.outputs import LoopStats

        return LoopStats(len(self.waiting), len(self.running), self.steps, self.prompt_tokens, 0, 0, 1)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--step-ms", type=float, default=8.0)
    ap.add_argument("--concurrency", type=int, default=128)
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--output", type=int, default=128)
    ap.add_argument("--clients", type=int, default=None)
    ap.add_argument("--client", choices=("raw", "openai"), default="raw")
    args = ap.parse_args()

    from kern.serve.server import start
    from kern_models.common.random_checkpoint import word_tokenizer

    folder = Path(tempfile.mkdtemp(prefix="kern-serve-cpu-"))
    word_tokenizer(VOCAB).save(str(folder / "tokenizer.json"))
    client.prepare(folder)
    running = start(partial(FakeLoop, str(folder), args.step_ms / 1e3, args.concurrency))
    engine = getattr(running.driver, "pid", None)  # None: an engine thread (kern before its engine process)
    import random

    rng = random.Random(0)
    system = client.words(rng, args.prompt // 2, VOCAB)
    requests = [[{"role": "system", "content": system},
                 {"role": "user", "content": client.words(rng, args.prompt - args.prompt // 2, VOCAB)}]
                for _ in range(args.requests)]
    clients = args.clients or client.default_clients(args.concurrency)
    try:
        with ProcessPoolExecutor(clients, mp_context=get_context("spawn")) as pool:
            client.run(pool, clients, running.url, "fake", requests[:clients], clients, 8, args.client)  # warm-up
            api0, eng0 = time.process_time(), cpu_seconds(engine) if engine else 0.0
            r = client.run(pool, clients, running.url, "fake", requests, args.concurrency, args.output, args.client)
            api, eng = time.process_time() - api0, (cpu_seconds(engine) - eng0) if engine else 0.0
    finally:
        running.close()
    tokens = max(1, r["output_tokens"])
    print(json.dumps({"step_ms": args.step_ms, "concurrency": args.concurrency, "completed": r["completed"],
                      "failed": r["failed"], "output_throughput": r["output_throughput"],
                      "asked_tok_s": round(args.concurrency / (args.step_ms / 1e3)) if args.step_ms else None,
                      "ttft_ms": r["ttft_ms"], "itl_ms": r["itl_ms"],
                      "api_us_per_token": round(1e6 * api / tokens, 1),
                      "engine_us_per_token": round(1e6 * eng / tokens, 1),
                      "client_cpu": r["client_cpu"], "cpus": os.cpu_count()}))


if __name__ == "__main__":
    main()
