"""Loops the test servers run in their engine process. The engine process is spawned, so what
builds a loop must pickle: module-level functions here, light to import (no torch)."""

from __future__ import annotations

import os

from kern.generation.outputs import LoopStats
from kern.tokenizer import Tokenizer


def model_loop(checkpoint, context: int, max_seqs: int | None = None, target: str = "cpu", warm: bool = False,
               state_budget: int | None = None, host_bytes: int | None = 0):
    import kern

    loop = kern.load(checkpoint, target=target, context=context, max_seqs=max_seqs, progress=False, state_budget=state_budget,
                     host_bytes=host_bytes).loop
    if warm:
        loop.warm_up(progress=False)
    return loop


def leased_pages(loop) -> int:
    """Pool pages held by leases, not by cached prefixes (LoopStats counts both)."""
    u = loop.paging.pool.usage()[loop.paging.state]
    return u["held"] - u["cached"]


def slow_model_loop(checkpoint, context: int, delay: float):
    """model_loop whose every step takes `delay` seconds more: a stream that outlives a short
    shutdown grace on a model that is otherwise done in milliseconds."""
    import time

    loop = model_loop(checkpoint, context, 4)
    step = loop.step

    def slow(emit=None):
        time.sleep(delay)
        return step(emit)

    loop.step = slow
    return loop


def capacity(loop) -> int:
    """Tokens the state memory holds in all."""
    return loop.paging.capacity()


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

    def step(self, emit=None):
        raise RuntimeError("device lost")

    def stats(self):
        return LoopStats(0, len(self.queued), 0, 0, 0, 0, 1)


class DyingLoop(BrokenLoop):
    """Its first step ends the engine process, the way a segfault or the OOM killer would."""

    def step(self, emit=None):
        os._exit(3)


def broken_loop(checkpoint) -> BrokenLoop:
    return BrokenLoop(Tokenizer(checkpoint))


def dying_loop(checkpoint) -> DyingLoop:
    return DyingLoop(Tokenizer(checkpoint))


def failing_load(kind: str):
    """Building the loop fails: with a bug, or with a user's error whose type takes more than
    its message (pickling would call it with the message alone)."""
    from kern.manifest.problems import ManifestError, Problem
    from kern.runtime.devices.cuda.errors import CudaError

    if kind == "manifest":
        raise ManifestError("m/manifest.json", [Problem("buffers.x", "unknown dtype 'bf17'")])
    if kind == "cuda":
        raise CudaError("cuCtxCreate", 2, "CUDA_ERROR_OUT_OF_MEMORY", "device 0")
    raise ValueError("not what the engine expected")


class CountingLoop:
    """Every running request gets token 7 (text " w7") each step until its max_tokens."""

    context, model_name, tokenizer = 64, "counting", None

    def __init__(self):
        self.running: dict[str, list[int]] = {}  # request id -> [max tokens, made]
        self.steps = 0

    def add(self, request_id, prompt_ids, params):
        self.running[request_id] = [params.max_tokens, 0]

    def abort(self, request_id):
        self.running.pop(request_id, None)

    def has_work(self):
        return bool(self.running)

    def step(self, emit=None):
        from kern.generation.outputs import Delta

        self.steps += 1
        out = []
        for rid, seq in list(self.running.items()):
            seq[1] += 1
            finish = "length" if seq[1] == seq[0] else None
            out.append(Delta(rid, (7,), " w7", (), finish, 3, 0, seq[1]))
            if finish:
                del self.running[rid]
        return out

    def stats(self):
        return LoopStats(0, len(self.running), self.steps, 0, 0, 0, 1)


def deployment_loop(manifest, checkpoint, max_seqs: int | None = None):
    """The loop of a generated deployment (manifest.json) over a checkpoint."""
    import kern

    return kern.load(checkpoint, manifest=manifest, max_seqs=max_seqs, progress=False).loop


def leased_units(loop) -> dict[str, int]:
    """Each paged and per-sequence state's units held by leases, not by cached prefixes."""
    return {name: u["held"] - u["cached"] for name, u in loop.paging.pool.usage().items() if name != "chunks"}
