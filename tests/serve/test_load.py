"""Many clients at once, clients that go away, and what /metrics says about it."""

from __future__ import annotations

import asyncio
import http.client
import json
import logging
import re
import socket
import threading
import time
from urllib.parse import urlsplit

import openai

from . import engines
from .conftest import API_KEY, get, leased_pages, post, wait_idle, words


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


def test_a_client_that_disconnects_mid_body_is_counted_not_logged_as_a_traceback(server, model_name):
    def gone() -> float:
        _, text = get(server, "/metrics")
        m = re.search(r'^kern_requests_total\{endpoint="completions",status="499"\} (\S+)$', text, re.MULTILINE)
        return float(m.group(1)) if m else 0.0

    before, logged = gone(), []
    handler = logging.Handler()
    handler.emit = logged.append
    log = logging.getLogger("uvicorn.error")
    log.addHandler(handler)
    try:
        u = urlsplit(server.url)
        with socket.create_connection((u.hostname, u.port), timeout=10) as s:  # 1000 bytes promised, 10 sent
            s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {API_KEY}\r\n"
                      "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"model\":".encode())
        deadline = time.monotonic() + 20
        while gone() == before:
            assert time.monotonic() < deadline, "the disconnect was never counted as a 499"
            time.sleep(0.05)
    finally:
        log.removeHandler(handler)
    assert not [r for r in logged if r.exc_info], [r.getMessage() for r in logged]


def test_health_answers_while_a_prompt_is_being_tokenized(server, model_name, monkeypatch):
    """Tokenizing a long prompt (5 MB: seconds) runs off the event loop: here the tokenizer
    blocks until /health has answered, which it could not if it ran on the loop."""
    tokenizer = server.driver.info.tokenizer
    entered, release, answers = threading.Event(), threading.Event(), {}
    real = tokenizer.encode

    def blocking(text, *args, **kw):
        entered.set()
        release.wait(30)
        return real(text, *args, **kw)

    monkeypatch.setattr(tokenizer, "encode", blocking)
    body = {"model": model_name, "prompt": words(5), "max_tokens": 2, "temperature": 0}
    client = threading.Thread(target=lambda: answers.update(completion=post(server, "/v1/completions", body)))
    client.start()
    try:
        assert entered.wait(30), "the request never reached the tokenizer"
        u = urlsplit(server.url)
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=5)
        conn.request("GET", "/health")
        answers["health"] = conn.getresponse().status
        conn.close()
    finally:
        release.set()
        client.join(60)
    assert answers["health"] == 200
    assert answers["completion"][0] == 200
