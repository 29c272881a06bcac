"""kern serve --pp 2 on the cpu: the model in two stages, a CpuDevice and a thread each; requests
served at once (their decode steps in micro-batches) get the plain server's text."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from functools import partial

import pytest

from kern.commands.serve import build_loop
from kern.serve.server import start

from .conftest import API_KEY, CONTEXT, chat_text, words


@pytest.fixture(scope="module")
def pp_server(checkpoint):
    running = start(partial(build_loop, str(checkpoint), None, "cpu", CONTEXT, 16, None, None, pp=2),
                    api_key=API_KEY, aliases=(str(checkpoint),))
    yield running
    running.close()


def _chat(server, model, content: str) -> str:
    return chat_text(server, model, content, 24)


def test_a_pipelined_server_answers_concurrent_requests_as_the_plain_one(server, pp_server, model_name):
    prompts = [words(8 + 3 * i, 10 + 5 * i) for i in range(6)]
    plain = [_chat(server, model_name, p) for p in prompts]
    with ThreadPoolExecutor(6) as pool:
        assert list(pool.map(lambda p: _chat(pp_server, model_name, p), prompts)) == plain
