"""Loops the test servers run in their engine process. The engine process is spawned, so what
builds a loop must pickle: module-level functions here, light to import (no torch)."""

from __future__ import annotations

import os

from kern.generation.outputs import LoopStats
from kern.tokenizer import Tokenizer


def model_loop(checkpoint, context: int, max_seqs: int | None = None, target: str = "cpu", warm: bool = False):
    import kern

    loop = kern.load(checkpoint, target=target, context=context, max_seqs=max_seqs, progress=False).loop
    if warm:
        loop.warm_up(progress=False)
    return loop


def leased_pages(loop) -> int:
    """Pool pages held by leases, not by cached prefixes (LoopStats counts both)."""
    u = loop.paging.pool.usage()[loop.paging.state]
    return u["held"] - u["cached"]


def check_pool(loop) -> None:
    loop.paging.pool.check()


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


class DyingLoop(BrokenLoop):
    """Its first step ends the engine process, the way a segfault or the OOM killer would."""

    def step(self):
        os._exit(3)


def broken_loop(checkpoint) -> BrokenLoop:
    return BrokenLoop(Tokenizer(checkpoint))


def dying_loop(checkpoint) -> DyingLoop:
    return DyingLoop(Tokenizer(checkpoint))


def failing_load(checkpoint):
    raise ValueError(f"{checkpoint}: not what the engine expected")
