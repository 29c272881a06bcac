"""Modules fetched by URL (files/modules.py), against a loopback HTTP server: fetched once and
cached by sha256, a wrong sha256 refused before anything loads the bytes, and an interrupted or
truncated download never cached (the next fetch downloads again)."""

from __future__ import annotations

import hashlib
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from kern.files.errors import ModuleError
from kern.files.modules import cache_dir, fetch

BODY = b"# a CPU module\nVALUE = 42\n" * 100
SHA = hashlib.sha256(BODY).hexdigest()


class Handler(BaseHTTPRequestHandler):
    """/ok: the body; /cut: announces the whole body, sends half, hangs up; /short: a truncated
    file (announces and sends half); /missing: 404. Every request is counted per path."""

    def do_GET(self):  # noqa: N802 - the http.server API
        self.server.hits[self.path] = self.server.hits.get(self.path, 0) + 1
        if self.path == "/missing":
            self.send_error(404)
            return
        half = BODY[:len(BODY) // 2]
        self.send_response(200)
        self.send_header("Content-Length", str(len(half) if self.path == "/short" else len(BODY)))
        self.end_headers()
        self.wfile.write(BODY if self.path == "/ok" else half)
        if self.path == "/cut":
            self.close_connection = True

    def log_message(self, *args):  # keep pytest's output clean
        pass


@pytest.fixture()
def server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.hits = {}
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.fixture(autouse=True)
def _empty_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KERN_CACHE", str(tmp_path / "cache"))


def url(srv, path: str) -> str:
    return f"http://127.0.0.1:{srv.server_address[1]}{path}"


def blobs() -> list[Path]:
    d = cache_dir() / "blobs"
    return sorted(d.iterdir()) if d.is_dir() else []


def test_fetched_once_then_served_from_the_cache(server, tmp_path):
    assert fetch("kernels", url(server, "/ok"), SHA, tmp_path) == BODY
    assert fetch("kernels", url(server, "/ok"), SHA, tmp_path) == BODY
    assert server.hits == {"/ok": 1}
    assert blobs() == [cache_dir() / "blobs" / SHA]


def test_a_damaged_cache_entry_is_fetched_again(server, tmp_path):
    fetch("kernels", url(server, "/ok"), SHA, tmp_path)
    (cache_dir() / "blobs" / SHA).write_bytes(b"bit rot")
    assert fetch("kernels", url(server, "/ok"), SHA, tmp_path) == BODY
    assert server.hits == {"/ok": 2}


BAD = [  # (id, path, pinned sha256, what the message says)
    ("wrong-sha256", "/ok", "0" * 64, "sha256 mismatch, refused before load: manifest pins " + "0" * 64),
    ("cut-off", "/cut", SHA, "the download was cut off"),
    ("truncated-file", "/short", SHA, "sha256 mismatch, refused before load"),  # complete as HTTP, half the module
    ("not-found", "/missing", SHA, "HTTP 404"),
]


@pytest.mark.parametrize("path,sha,says", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_a_bad_download_is_refused_and_never_cached(server, tmp_path, path, sha, says):
    for attempt in (1, 2):  # nothing was cached: the second fetch downloads again
        with pytest.raises(ModuleError) as e:
            fetch("kernels", url(server, path), sha, tmp_path)
        assert "module 'kernels'" in str(e.value) and says in str(e.value)
        assert server.hits == {path: attempt}
        assert blobs() == [], "no blob and no temporary file is left behind"


def test_an_unreachable_server_is_one_clear_error(tmp_path):
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    port = srv.server_address[1]
    srv.server_close()  # nothing listens on this port now
    with pytest.raises(ModuleError, match=r"module 'kernels': cannot fetch http://127.0.0.1:\d+/ok: "):
        fetch("kernels", f"http://127.0.0.1:{port}/ok", SHA, tmp_path)
    assert blobs() == []
