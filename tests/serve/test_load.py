"""Many clients at once, clients that go away, and what /metrics says about it."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import time
from urllib.parse import urlsplit

import openai

from . import engines
from .conftest import API_KEY, get, leased_pages, wait_idle, words


def metric(server, name: str) -> float:
    _, text = get(server, "/metrics")
    m = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    assert m, f"{name} not in /metrics"
    return float(m.group(1))


def test_300_requests_at_concurrency_32_all_succeed_and_the_pool_returns_to_idle(server, model_name):
    baseline = leased_pages(server)
    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)
    gate = asyncio.Semaphore(32)

    async def one(i: int) -> int:
        async with gate:
            prompt = words(8 + i % 24, 10 + i % 150)
            if i % 2:
                stream = await client.completions.create(model=model_name, prompt=prompt, max_tokens=4,
                                                         temperature=0, stream=True,
                                                         stream_options={"include_usage": True})
                usage = [ch.usage async for ch in stream][-1]
                return usage.completion_tokens
            out = await client.chat.completions.create(model=model_name, messages=[{"role": "user",
                                                       "content": prompt}], max_tokens=4, temperature=0.8, seed=i)
            return out.usage.completion_tokens

    async def everyone():
        try:
            return await asyncio.gather(*(one(i) for i in range(300)))
        finally:
            await client.close()

    t0 = time.monotonic()
    made = asyncio.run(everyone())
    assert len(made) == 300 and all(1 <= n <= 4 for n in made)
    assert leased_pages(server) == baseline  # every lease given back; cached prefixes may stay
    server.driver.query(engines.check_pool)  # and the pool's books are consistent
    assert metric(server, "kern_running_sequences") == 0
    assert metric(server, "kern_queue_depth") == 0
    assert time.monotonic() - t0 < 90


def test_a_non_streaming_client_that_disconnects_is_aborted(server, model_name):
    before = leased_pages(server)
    made_before = metric(server, "kern_output_tokens_total")
    body = json.dumps({"model": model_name, "prompt": words(10), "max_tokens": 200, "temperature": 0,
                       "ignore_eos": True}).encode()
    u = urlsplit(server.url)
    sock = socket.create_connection((u.hostname, u.port))
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + f"Authorization: Bearer {API_KEY}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    deadline = time.monotonic() + 20
    while server.driver.stats.running == 0:
        assert time.monotonic() < deadline, "the request never started"
        time.sleep(0.005)
    sock.close()
    wait_idle(server)
    assert leased_pages(server) == before
    assert metric(server, "kern_output_tokens_total") - made_before < 200


def test_metrics_count_requests_tokens_and_latencies(server, client, model_name):
    before = metric(server, 'kern_requests_total{endpoint="completions",status="200"}')
    client.completions.create(model=model_name, prompt=words(5), max_tokens=3, temperature=0)
    _, text = get(server, "/metrics")
    for name in ("kern_prompt_tokens_total", "kern_output_tokens_total", "kern_time_to_first_token_seconds_count",
                 "kern_inter_token_latency_seconds_count", "kern_queue_depth", "kern_running_sequences",
                 "kern_prefix_cache_hit_rate", "kern_pool_pages_used", "kern_pool_pages_total", "kern_pool_use"):
        assert re.search(rf"^{re.escape(name)} ", text, re.MULTILINE), name
    assert metric(server, 'kern_requests_total{endpoint="completions",status="200"}') == before + 1
    assert metric(server, "kern_pool_pages_total") > 0


def test_health(server):
    assert get(server, "/health") == (200, '{"status":"ok"}')
