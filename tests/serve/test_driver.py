"""The engine process and the API process's side of it: an engine that fails or dies is
reported to every waiting request and refuses new ones with a 503 (/health says so, nothing
hangs); what building the loop raised reaches the caller as it was raised; a step's Deltas and
stats cross the pipe whole."""

from __future__ import annotations

import pickle
from dataclasses import fields
from functools import partial

import pytest

from kern.generation.outputs import Delta, LoopStats, TokenLogprob
from kern.generation.params import SamplingParams
from kern.manifest.problems import ManifestError
from kern.runtime.devices.cuda.errors import CudaError
from kern.serve import wire
from kern.serve.driver import Driver
from kern.serve.server import start
from kern.tokenizer import Tokenizer

from . import engines
from .conftest import get, post


@pytest.mark.parametrize("make_loop,message", [
    (engines.broken_loop, "the engine failed: device lost"),
    (engines.dying_loop, "the engine process exited unexpectedly (exit code 3)"),
], ids=["step raises", "process dies"])
def test_an_engine_failure_is_a_503_and_the_server_stays_up(checkpoint, make_loop, message):
    running = start(partial(make_loop, checkpoint))
    try:
        body = {"model": "broken", "prompt": "w5 w6", "max_tokens": 3}
        for _ in range(2):  # the request that meets the failure, then one after it
            code, out = post(running, "/v1/completions", body, key=None)
            assert code == 503
            assert out["error"]["type"] == "server_error" and message in out["error"]["message"]
        status, text = get(running, "/health")
        assert status == 503 and message in text
    finally:
        running.close()


@pytest.mark.parametrize("kind,raised,line", [
    ("bug", ValueError, "not what the engine expected"),
    ("manifest", ManifestError, "m/manifest.json: manifest failed verification:\n  buffers.x: unknown dtype 'bf17'"),
    ("cuda", CudaError, "cuCtxCreate failed with CUDA_ERROR_OUT_OF_MEMORY [2] (device 0)"),
])
def test_what_building_the_loop_raised_is_raised_by_start(kind, raised, line):
    driver = Driver(partial(engines.failing_load, kind))
    with pytest.raises(raised) as e:
        driver.start()
    assert type(e.value) is raised and str(e.value) == line  # what `kern serve` says, in one line
    assert "in the engine process" in e.value.__notes__[0]  # the traceback, for a bug


def test_deltas_and_stats_cross_the_pipe_whole():
    d = Delta("r-0", (5, 6), " w5 w6", (TokenLogprob(5, -0.5, ((5, -0.5), (7, -1.0))),), "stop", 9, 4, 2)
    assert wire.unpack_delta(wire.pack_delta(d)) == d
    assert len(wire.pack_delta(d)) == len(fields(Delta))  # every field, a new one too
    s = LoopStats(*range(1, len(fields(LoopStats)) + 1))
    assert wire.unpack_stats(wire.pack_stats(s)) == s


def test_a_tokenizer_that_has_rendered_its_template_still_crosses_to_the_api_process(checkpoint):
    tok = Tokenizer(checkpoint)
    text = tok.chat([{"role": "user", "content": "w5"}])
    other = pickle.loads(pickle.dumps(tok))
    assert other.chat([{"role": "user", "content": "w5"}]) == text


def test_each_request_gets_a_steps_items_in_one_call_in_order():
    driver = Driver(engines.CountingLoop)  # not started: its routing alone
    got: dict[str, list] = {"x": [], "y": []}
    for rid in ("x-0", "x-1", "y-0"):
        driver.submit(rid, [5], SamplingParams(), got[rid[0]].append)

    idle = wire.pack_stats(LoopStats(*(0 for _ in fields(LoopStats))))

    def step(accepted, *deltas):
        return wire.Step(accepted, [], [wire.pack_delta(Delta(rid, (7,), " w7", (), finish, 1, 0, 1))
                                        for rid, finish in deltas], idle, None)

    driver._route(step(["x-0", "x-1", "y-0"], ("x-0", None), ("y-0", None), ("x-1", "stop")))
    driver._route(step([], ("x-0", None), ("x-1", None)))  # x-1 has finished: nothing more for it
    (first, second), (only,) = got["x"], got["y"]
    assert [(type(i).__name__, i.request_id) for i in first] == [
        ("Accepted", "x-0"), ("Accepted", "x-1"), ("Delta", "x-0"), ("Delta", "x-1")]
    assert [i.request_id for i in second] == ["x-0"]
    assert [type(i).__name__ for i in only] == ["Accepted", "Delta"]
