"""Stopping a server with requests in flight: it stops admitting (a 503 `shutting_down`), lets
what runs finish within a grace period, then ends the rest with an error: a stream's last events
are an error event and `data: [DONE]`, and the server exits cleanly (no traceback, exit 0)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from functools import partial

from kern.serve.server import start

from . import engines
from .conftest import API_KEY, CONTEXT, post, words
from .test_cli import free_port, wait_up


def events(resp) -> list:
    """A stream's events as they come: parsed JSON, or the string "[DONE]"."""
    out = []
    for line in resp:
        line = line.decode().strip()
        if line.startswith("data: "):
            data = line[len("data: "):]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def open_stream(url: str, model: str, max_tokens: int, key: str | None = API_KEY):
    req = urllib.request.Request(url + "/v1/completions", json.dumps(
        {"model": model, "prompt": words(8), "max_tokens": max_tokens, "stream": True, "temperature": 0,
         "ignore_eos": True}).encode(), {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"}
                                                                                  if key else {})})
    return urllib.request.urlopen(req, timeout=120)


def test_a_stream_that_outlives_the_grace_ends_with_an_error_event_and_done(checkpoint):
    server = start(partial(engines.slow_model_loop, checkpoint, CONTEXT, 0.05), api_key=API_KEY, grace=0.5)
    resp = open_stream(server.url, server.driver.info.model_name, 200)  # 200 steps of 50 ms: 10 s
    first = resp.readline()  # the stream is under way
    assert first.startswith(b"data: ")
    closing = threading.Thread(target=server.close)
    t0 = time.monotonic()
    closing.start()
    time.sleep(0.2)
    # while it stops, nothing new is admitted
    status, body = post(server, "/v1/completions", {"model": server.driver.info.model_name, "prompt": "w5",
                                                    "max_tokens": 2})
    assert status == 503 and body["error"]["code"] == "shutting_down"
    got = events(resp)
    closing.join(30)
    assert not closing.is_alive() and time.monotonic() - t0 < 10
    *text, error, done = got
    assert done == "[DONE]" and all("choices" in e for e in text)
    assert error["error"] == {"message": "the server is shutting down: this request was cut short",
                              "type": "server_error", "param": None, "code": "shutting_down"}


def test_a_stream_that_ends_within_the_grace_ends_as_it_would(checkpoint):
    server = start(partial(engines.slow_model_loop, checkpoint, CONTEXT, 0.05), api_key=API_KEY, grace=10)
    resp = open_stream(server.url, server.driver.info.model_name, 20)  # 20 steps of 50 ms: within the grace
    resp.readline()
    closing = threading.Thread(target=server.close)
    closing.start()
    got = events(resp)
    closing.join(30)
    assert got[-1] == "[DONE]" and got[-2]["choices"][0]["finish_reason"] == "length"
    assert not any("error" in e for e in got[:-1])


def test_ctrl_c_on_kern_serve_with_a_stream_in_flight_exits_cleanly():
    """The embedded model on the CPU: a long stream is still running when Ctrl-C arrives."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "kern.cli", "serve", "--target", "cpu", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        model = wait_up(proc, base, 180)["id"]
        resp = open_stream(base, model, 2000, key=None)  # far more than the grace lets it make
        assert resp.readline().startswith(b"data: ")
    finally:
        proc.send_signal(signal.SIGINT)
    got = events(resp)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "Traceback" not in out and "Exception" not in out, out
    assert "cut 1 sequence(s) short with an error event" in out
    assert got[-1] == "[DONE]" and got[-2]["error"]["code"] == "shutting_down"
