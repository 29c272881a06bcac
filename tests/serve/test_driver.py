"""The engine thread over a loop whose step fails: every waiting request is told, new ones are
refused with a 503, /health says so, and nothing hangs."""

from __future__ import annotations

from kern.generation.outputs import LoopStats
from kern.serve.server import start
from kern.tokenizer import Tokenizer

from .conftest import get, post


class BrokenLoop:
    """Accepts requests; its first step fails the way a lost device would."""

    context, model_name = 64, "broken"

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.queued: list[str] = []

    def add(self, request_id, prompt_ids, params):
        self.queued.append(request_id)

    def abort(self, request_id):
        if request_id in self.queued:
            self.queued.remove(request_id)

    def has_work(self):
        return bool(self.queued)

    def step(self):
        raise RuntimeError("device lost")

    def stats(self):
        return LoopStats(0, len(self.queued), 0, 0, 0, 0, 1)


def test_an_engine_failure_is_a_503_and_the_server_stays_up(checkpoint):
    running = start(lambda: BrokenLoop(Tokenizer(checkpoint)))
    try:
        body = {"model": "broken", "prompt": "w5 w6", "max_tokens": 3}
        for _ in range(2):  # the request that meets the failure, then one after it
            code, out = post(running, "/v1/completions", body, key=None)
            assert code == 503
            assert out["error"]["type"] == "server_error" and "the engine failed: device lost" in out["error"]["message"]
        status, text = get(running, "/health")
        assert status == 503 and "device lost" in text
    finally:
        running.close()
