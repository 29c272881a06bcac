"""Start and stop a server over a Loop: the engine process, the app, uvicorn on loopback.

`kern serve` runs it in the foreground; tests and benchmarks run it in a background thread."""

from __future__ import annotations

import asyncio
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import uvicorn

from ..errors import KernError
from .app import make_app
from .driver import Driver
from .metrics import Metrics

if TYPE_CHECKING:
    from ..generation.loop import Loop


GRACE_S = 5.0  # on stopping, what the requests in flight get to finish before they are cut
STOPPING = "the server is shutting down"
CUT = "the server is shutting down: this request was cut short"


class Server(uvicorn.Server):
    """uvicorn's server, stopping kern's way: stop admitting (a 503 `shutting_down`), let the
    requests in flight finish for up to `grace` seconds (a second Ctrl-C cuts at once), end
    the rest with an error (a stream's error event and [DONE]), and only then close the
    connections; no response task is ever cancelled under a client."""

    def __init__(self, config: uvicorn.Config, driver: Driver, grace: float):
        super().__init__(config)
        self.driver, self.grace = driver, grace

    async def shutdown(self, sockets=None) -> None:
        d = self.driver
        d.closing = STOPPING
        if d.in_flight:
            print(f"[kern] stopping: {d.in_flight} sequence(s) in flight get {self.grace:g} s to finish "
                  "(Ctrl-C again cuts them now)", file=sys.stderr)
        deadline = time.monotonic() + self.grace  # a wait for people, never part of a result
        while d.in_flight and not self.force_exit and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if cut := d.close_streams(CUT):
            print(f"[kern] cut {cut} sequence(s) short with an error event", file=sys.stderr)
        await asyncio.sleep(0)  # their handlers write the error and [DONE] before connections close
        await super().shutdown(sockets)


@dataclass
class LiveServer:
    """A server started by start(): its URL, the engine process behind it, and close()."""

    url: str  # http://host:port, without /v1
    driver: Driver
    metrics: Metrics
    server: uvicorn.Server
    thread: threading.Thread

    def close(self) -> None:
        """Stop serving, then stop the engine process."""
        self.server.should_exit = True
        self.thread.join()
        self.driver.stop()


def listen(host: str, port: int) -> socket.socket:
    """The listening socket, bound before the model loads: a port in use or a host that is not
    this machine's is one line at once, and "serving" is said only of a socket that is bound."""
    try:
        return socket.create_server((host, port), backlog=2048)
    except socket.gaierror as exc:
        raise KernError(f"cannot listen on {host}:{port}: no such host ({exc.strerror})") from None
    except (OSError, OverflowError) as exc:
        why = getattr(exc, "strerror", None) or str(exc)
        raise KernError(f"cannot listen on {host}:{port}: {why}") from None


def _setup(make_loop: Callable[[], Loop], sock: socket.socket, api_key: str | None, log_level: str,
           aliases: tuple[str, ...] = (), grace: float = GRACE_S):
    """Start the engine process (it builds the loop), then the app over it, served on `sock`."""
    metrics = Metrics()
    driver = Driver(make_loop, on_step=metrics.observe_stats)
    driver.start()
    info = driver.info
    metrics.observe_stats(driver.stats)
    app = make_app(driver, info.tokenizer, model_name=info.model_name, context=info.context, vocab=info.vocab,
                   api_key=api_key, metrics=metrics, aliases=aliases)
    host, port = sock.getsockname()[:2]
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                            timeout_graceful_shutdown=5)
    return metrics, driver, Server(config, driver, grace)


def start(make_loop: Callable[[], Loop], *, host: str = "127.0.0.1", port: int = 0, api_key: str | None = None,
          log_level: str = "warning", timeout: float = 30.0, aliases: tuple[str, ...] = (),
          grace: float = GRACE_S) -> LiveServer:
    """Serve the loop `make_loop()` builds (in the engine process; it must pickle) from a
    background thread; port 0 picks a free one. Returns once listening. The engine process is
    spawned, so it imports the caller's main module: a script calling this keeps its work
    under `if __name__ == "__main__":`."""
    sock = listen(host, port)
    try:
        metrics, driver, server = _setup(make_loop, sock, api_key, log_level, aliases, grace)
    except BaseException:
        sock.close()
        raise
    thread = threading.Thread(target=server.run, args=([sock],), name="kern-http", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            driver.stop()
            raise KernError(f"the server did not start listening on {host}:{port}")
        time.sleep(0.01)
    bound = sock.getsockname()[1]
    return LiveServer(f"http://{host}:{bound}", driver, metrics, server, thread)


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(0)


def serve_forever(make_loop: Callable[[], Loop], *, host: str, port: int, api_key: str | None,
                  aliases: tuple[str, ...] = ()) -> None:
    """Serve in the foreground until interrupted (Ctrl-C or SIGTERM). uvicorn shuts down
    gracefully on either, then raises the signal again: SIGTERM's default would end the process
    there, before the engine process is stopped, so SIGTERM exits through the `finally`."""
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    with listen(host, port) as sock:
        metrics, driver, server = _setup(make_loop, sock, api_key, "info", aliases)
        try:
            info, where = driver.info, f"http://{host}:{sock.getsockname()[1]}"
            print(f"[kern] serving {info.model_name} (context {info.context}) on {where} "
                  "(chat page at /, API at /v1)", file=sys.stderr)
            server.run([sock])
        finally:
            driver.stop()
