"""Start and stop a server over a Loop: the engine thread, the app, uvicorn on loopback.

`kern serve` runs it in the foreground; tests and benchmarks run it in a background thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import uvicorn

from ..runtime.errors import KernError
from .app import make_app
from .driver import Driver
from .metrics import Metrics


@dataclass
class Running:
    url: str  # http://host:port, without /v1
    driver: Driver
    metrics: Metrics
    server: uvicorn.Server
    thread: threading.Thread

    def close(self) -> None:
        """Stop serving, then stop the engine thread."""
        self.server.should_exit = True
        self.thread.join()
        self.driver.stop()


def _setup(make_loop, host: str, port: int, api_key: str | None, log_level: str):
    """Start the engine thread (it builds the loop), then the app over it."""
    metrics = Metrics()
    driver = Driver(make_loop, on_step=metrics.observe_stats)
    driver.start()
    loop = driver.loop
    tok = loop.tokenizer
    app = make_app(driver, tok, model_name=loop.model_name, context=loop.context,
                   vocab=tok.tok.get_vocab_size(with_added_tokens=True), api_key=api_key, metrics=metrics)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                            timeout_graceful_shutdown=5)
    return metrics, driver, uvicorn.Server(config)


def start(make_loop: Callable[[], object], *, host: str = "127.0.0.1", port: int = 0, api_key: str | None = None,
          log_level: str = "warning", timeout: float = 30.0) -> Running:
    """Serve the loop `make_loop()` builds (on the engine thread) from background threads; port
    0 picks a free one. Returns once listening."""
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
    return Running(f"http://{host}:{bound}", driver, metrics, server, thread)


# The engine thread holds the GIL for all of a CPU step; at Python's default 5 ms switch
# interval the HTTP thread waited for it so long that one stream's tokens left in bursts
# (tiny model on the CPU, one client: ITL p50 0.8 ms, p99 52 ms; at 0.5 ms: p50 8.6 ms, p99 47
# ms, an even stream, throughput unchanged within noise).
SWITCH_INTERVAL_S = 0.0005


def serve_forever(make_loop: Callable[[], object], *, host: str, port: int, api_key: str | None) -> None:
    """Serve in the foreground until interrupted (Ctrl-C). This process is the server's own,
    so it also sets the interpreter's thread switch interval (SWITCH_INTERVAL_S)."""
    import sys

    sys.setswitchinterval(SWITCH_INTERVAL_S)
    metrics, driver, server = _setup(make_loop, host, port, api_key, "info")
    try:
        server.run()
    finally:
        driver.stop()
