"""kern serve on the hybrid (the tiny Kimi-Linear on the CPU, over loopback): 64 streams at once,
every lease given back after, and /metrics showing the MLA cache's pages and the KDA state's
slots drawn from one budget of chunks."""

from __future__ import annotations

import asyncio
import re
from functools import partial

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")


def gauges(text: str, name: str) -> dict[str, float]:
    """A labelled gauge's samples from /metrics: {label values joined by ',': value}."""
    out = {}
    for labels, value in re.findall(rf"^{name}\{{(.*?)\}} (\S+)$", text, re.MULTILINE):
        out[",".join(v for v in re.findall(r'="([^"]*)"', labels))] = float(value)
    return out


def test_64_streams_at_once_and_the_pool_back_to_its_baseline(kimi_config, kimi_ckpt, tmp_path):
    from kern.serve.server import start
    from kern_models.kimi_linear.generator import generate
    from tests.serve import engines
    from tests.serve.conftest import get, wait_idle

    dep = generate(kimi_config, tmp_path / "dep", target="cpu", model="tiny-kimi", tokens=64, seqs=64, context=256)
    server = start(partial(engines.deployment_loop, str(dep), str(kimi_ckpt), 64), timeout=120)
    try:
        baseline = server.driver.query(engines.leased_units)
        assert baseline == {"kv": 1, "kda": 1}  # the padding rows' scratch page and slot
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)
        peak = []

        async def one(i: int) -> int:
            stream = await client.completions.create(
                model=server.driver.info.model_name, prompt=[1 + (i * 37 + j * 11) % 200 for j in range(6 + i % 20)],
                max_tokens=6, temperature=0, stream=True, stream_options={"include_usage": True})
            chunks = [ch async for ch in stream]
            return chunks[-1].usage.completion_tokens

        async def watch(done: asyncio.Event):  # the running count while the streams run, not as each ends
            while not done.is_set():
                peak.append(server.driver.stats.running)
                await asyncio.sleep(0.002)

        async def everyone():
            done = asyncio.Event()
            watcher = asyncio.create_task(watch(done))
            try:
                return await asyncio.gather(*(one(i) for i in range(64)))
            finally:
                done.set()
                await watcher
                await client.close()

        made = asyncio.run(everyone())
        assert made == [6] * 64
        assert max(peak) > 4  # many ran at once, not one after another
        wait_idle(server, timeout=60)
        assert server.driver.query(engines.leased_units) == baseline
        server.driver.query(engines.check_pool)
        _, text = get(server, "/metrics")
        held, cached = gauges(text, "kern_pool_units_held"), gauges(text, "kern_pool_units_cached")
        assert held["kv,page"] >= 64 + 1 and held["kda,slot"] >= 64 + 1  # cached prefixes stay, with their slots
        # what leases hold, as /metrics tells it, is back at the baseline
        assert {k.split(",")[0]: held[k] - cached[k] for k in held} == baseline
        chunks = gauges(text, "kern_pool_chunks")
        total = float(re.search(r"^kern_pool_chunks_total (\S+)$", text, re.MULTILINE).group(1))
        assert set(chunks) == {"kv", "kda", "unmapped"} and sum(chunks.values()) == total > 0
    finally:
        server.close()
