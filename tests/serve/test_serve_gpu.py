"""kern serve on the GPU (skipped without one): a random SmolLM2-shaped checkpoint, the decode
graphs captured before serving, many concurrent clients, an abort, the pool back at idle.

    python -m pytest tests/serve/test_serve_gpu.py -m gpu -q"""

from __future__ import annotations

import asyncio
import json
from functools import partial

import openai
import pytest

from kern.serve.server import start

from . import engines
from .conftest import TEMPLATE, leased_pages, words


@pytest.fixture(scope="module")
def gpu_server(tmp_path_factory):
    from kern_models.common.random_checkpoint import make

    ckpt = make("smollm2-135m", tmp_path_factory.mktemp("gpu") / "ckpt", device="cuda")
    (ckpt / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    running = start(partial(engines.model_loop, ckpt, 1024, target="cuda", warm=True), timeout=300)
    yield running
    running.close()


@pytest.mark.gpu
def test_concurrent_clients_on_the_gpu(gpu_server):
    name = gpu_server.driver.info.model_name
    baseline = leased_pages(gpu_server)
    client = openai.AsyncOpenAI(base_url=gpu_server.url + "/v1", api_key="x", max_retries=0, timeout=120)
    gate = asyncio.Semaphore(32)

    async def one(i: int):
        async with gate:
            messages = [{"role": "system", "content": words(200, 500)}, {"role": "user", "content": words(20, i * 7)}]
            if i % 2:
                stream = await client.chat.completions.create(
                    model=name, messages=messages, max_tokens=32, temperature=0, stream=True,
                    stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
                chunks = [ch async for ch in stream]
                return chunks[-1].usage
            out = await client.chat.completions.create(model=name, messages=messages, max_tokens=32, temperature=0,
                                                       extra_body={"ignore_eos": True})
            return out.usage

    async def everyone():
        try:
            return await asyncio.gather(*(one(i) for i in range(96)))
        finally:
            await client.close()

    usages = asyncio.run(everyone())
    assert all(u.completion_tokens == 32 for u in usages)
    assert sum(u.prompt_tokens_details.cached_tokens for u in usages) > 0  # the shared system prompt
    assert leased_pages(gpu_server) == baseline


@pytest.mark.gpu
def test_an_abort_on_the_gpu_frees_the_lease(gpu_server):
    name = gpu_server.driver.info.model_name
    baseline = leased_pages(gpu_server)
    client = openai.OpenAI(base_url=gpu_server.url + "/v1", api_key="x", max_retries=0, timeout=60)
    stream = client.completions.create(model=name, prompt=words(40), max_tokens=900, temperature=0, stream=True,
                                       extra_body={"ignore_eos": True})
    for i, _ in enumerate(stream):
        if i == 5:
            break
    stream.close()
    assert leased_pages(gpu_server) == baseline
