"""kern serve --pp 2 on the cpu: the model in two stages, a CpuDevice and a thread each; requests
served at once (their decode steps in micro-batches) get the plain server's text."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from .conftest import chat_text, flagged_server, words


@pytest.fixture(scope="module")
def pp_server(checkpoint):
    yield from flagged_server(checkpoint, pp=2)


def _chat(server, model, content: str) -> str:
    return chat_text(server, model, content, 24)


def test_a_pipelined_server_answers_concurrent_requests_as_the_plain_one(server, pp_server, model_name):
    prompts = [words(8 + 3 * i, 10 + 5 * i) for i in range(6)]
    plain = [_chat(server, model_name, p) for p in prompts]
    with ThreadPoolExecutor(6) as pool:
        assert list(pool.map(lambda p: _chat(pp_server, model_name, p), prompts)) == plain
