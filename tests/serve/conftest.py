"""A live server on 127.0.0.1 over a tiny random checkpoint on the CPU, shared by the tests.

The checkpoint is a 2-layer llama of hidden size 64 with a word tokenizer (token i is the word
`w{i}`) and a chat template, so text in and out is exact and every step takes milliseconds."""

from __future__ import annotations

import http.client
import json
import time
from functools import partial
from pathlib import Path
from urllib.parse import urlsplit

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from kern.commands.serve import build_loop  # noqa: E402
from kern.serve.server import LiveServer, start  # noqa: E402
from kern_models.common.random_checkpoint import word_tokenizer  # noqa: E402

from . import engines  # noqa: E402

API_KEY = "test-key"
CONTEXT = 256
EOS = 2  # transformers' LlamaConfig default eos_token_id
# Every message is `w1 <content> w2`; the assistant's turn starts at w3.
TEMPLATE = ("{% for m in messages %}w1 {{ m['content'] }} w2 {% endfor %}"
            "{% if add_generation_prompt %}w3{% endif %}")


def tiny_chat_checkpoint(folder: Path, seed: int = 0) -> Path:
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=128, vocab_size=256, max_position_embeddings=512,
                                   eos_token_id=EOS)
    transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(folder)
    word_tokenizer(cfg.vocab_size).save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE, "eos_token": f"w{EOS}"}))
    return folder


def words(n: int, start: int = 10) -> str:
    """A prompt of n words (n tokens) that avoids the template's and EOS's words."""
    return " ".join(f"w{start + i % 200}" for i in range(n))


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory) -> Path:
    return tiny_chat_checkpoint(tmp_path_factory.mktemp("tiny-chat"))


@pytest.fixture(scope="session")
def server(checkpoint) -> LiveServer:
    running = start(partial(engines.model_loop, checkpoint, CONTEXT, 16), api_key=API_KEY, aliases=(str(checkpoint),))
    yield running
    running.close()


def flagged_server(checkpoint: Path, **flags):
    """A server on the loop `kern serve` builds with these flags (pp=2, speculate="ngram:6"), for
    a module fixture to `yield from`."""
    running = start(partial(build_loop, str(checkpoint), None, "cpu", CONTEXT, 16, None, None, **flags),
                    api_key=API_KEY, aliases=(str(checkpoint),))
    yield running
    running.close()


@pytest.fixture(scope="session")
def model_name(server) -> str:
    return server.driver.info.model_name


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=60)


def post(server: LiveServer, path: str, body: bytes | dict, key: str | None = API_KEY) -> tuple[int, dict]:
    """A raw POST (bad input the official client would not send): (status, JSON body)."""
    u = urlsplit(server.url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    conn.request("POST", path, body if isinstance(body, bytes) else json.dumps(body).encode(), headers)
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, json.loads(data)


def chat_text(server: LiveServer, model: str, content: str, n: int) -> str:
    """One greedy chat completion's text (status 200 asserted)."""
    status, body = post(server, "/v1/chat/completions", {
        "model": model, "messages": [{"role": "user", "content": content}], "max_tokens": n, "temperature": 0})
    assert status == 200, body
    return body["choices"][0]["message"]["content"]


def get(server: LiveServer, path: str) -> tuple[int, str]:
    u = urlsplit(server.url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    conn.request("GET", path)
    r = conn.getresponse()
    out = r.status, r.read().decode()
    conn.close()
    return out


def wait_idle(server: LiveServer, timeout: float = 20.0):
    """The loop's stats once no sequence runs or waits (the driver replaces them per step)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = server.driver.stats
        if s.running == 0 and s.waiting == 0:
            return s
        time.sleep(0.02)
    raise AssertionError(f"the loop is still busy after {timeout}s: {server.driver.stats}")


def leased_pages(server: LiveServer) -> int:
    """Pool pages held by leases, not by cached prefixes, once the loop is idle."""
    wait_idle(server)
    return server.driver.query(engines.leased_pages)
