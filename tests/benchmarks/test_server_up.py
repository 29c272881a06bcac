"""The serve benches' start-up check (bench/hybrid_serve.py `up`, kimi_long.py's too): a port
that already answers before the bench's own server is up belongs to another server, one a killed
run left behind. Measuring that one under this run's name is refused (2026-12-06: a run under
`timeout` outlived by its server, the next run measured the old server's step size as its own)."""

from __future__ import annotations

import http.server
import socket
import subprocess
import sys
import threading

import pytest

from tests.benchmarks import scripts

hybrid_serve = scripts.load("hybrid_serve")


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # the name http.server calls
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


def test_a_port_another_server_answers_is_refused():
    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    ours = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with pytest.raises(SystemExit, match="already answers before this bench's server is up"):
            hybrid_serve.up(f"http://127.0.0.1:{other.server_address[1]}", ours, 5)
    finally:
        ours.kill()
        other.shutdown()


def test_a_server_that_dies_before_answering_is_not_up():
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ours = subprocess.Popen([sys.executable, "-c", "pass"])
    ours.wait()
    assert hybrid_serve.up(f"http://127.0.0.1:{port}", ours, 5) is False
