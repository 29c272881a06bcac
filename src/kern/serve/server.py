"""Start and stop a server over a Loop: the engine process, the app, uvicorn on loopback.

`kern serve` runs it in the foreground; tests and benchmarks run it in a background thread."""

from __future__ import annotations

import signal
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


def _setup(make_loop: Callable[[], Loop], host: str, port: int, api_key: str | None, log_level: str):
    """Start the engine process (it builds the loop), then the app over it."""
    metrics = Metrics()
    driver = Driver(make_loop, on_step=metrics.observe_stats)
    driver.start()
    info = driver.info
    metrics.observe_stats(driver.stats)
    app = make_app(driver, info.tokenizer, model_name=info.model_name, context=info.context, vocab=info.vocab,
                   api_key=api_key, metrics=metrics)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                            timeout_graceful_shutdown=5)
    return metrics, driver, uvicorn.Server(config)


def start(make_loop: Callable[[], Loop], *, host: str = "127.0.0.1", port: int = 0, api_key: str | None = None,
          log_level: str = "warning", timeout: float = 30.0) -> LiveServer:
    """Serve the loop `make_loop()` builds (in the engine process; it must pickle) from a
    background thread; port 0 picks a free one. Returns once listening. The engine process is
    spawned, so it imports the caller's main module: a script calling this keeps its work
    under `if __name__ == "__main__":`."""
    metrics, driver, server = _setup(make_loop, host, port, api_key, log_level)
    thread = threading.Thread(target=server.run, name="kern-http", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            driver.stop()
            raise KernError(f"the server did not start listening on {host}:{port}")
        time.sleep(0.01)
    bound = server.servers[0].sockets[0].getsockname()[1]
    return LiveServer(f"http://{host}:{bound}", driver, metrics, server, thread)


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(0)


def serve_forever(make_loop: Callable[[], Loop], *, host: str, port: int, api_key: str | None) -> None:
    """Serve in the foreground until interrupted (Ctrl-C or SIGTERM). uvicorn shuts down
    gracefully on either, then raises the signal again: SIGTERM's default would end the process
    there, before the engine process is stopped, so SIGTERM exits through the `finally`."""
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    metrics, driver, server = _setup(make_loop, host, port, api_key, "info")
    try:
        server.run()
    finally:
        driver.stop()
