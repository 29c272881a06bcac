"""The engine thread: the one owner of the (single-threaded) Loop.

The thread builds the loop itself: a device context is current on one thread only (CUDA's is
per thread), so the thread that loads the model, captures its graphs and steps it is one.
Requests reach it through a thread-safe inbox (add, abort); it steps the loop while there is
work and hands every Delta to its request's asyncio side with call_soon_threadsafe. An abort
is taken before the next step, so a client that goes away frees its lease within one step."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass

from ..generation.params import SamplingParams
from ..runtime.errors import KernError


@dataclass(frozen=True, slots=True)
class Accepted:
    """The loop queued the request."""

    request_id: str


@dataclass(frozen=True, slots=True)
class Refused:
    """The loop refused the request (it can never run) or the engine failed: the message."""

    request_id: str
    message: str
    engine_failed: bool = False


@dataclass(frozen=True, slots=True)
class Sink:
    """Where a request's items go: `put` runs on the asyncio loop `aio`. The engine thread wakes
    each loop once per step with everything the step made for it, not once per item (fewer
    wake-ups and GIL hand-offs, so tokens leave as they are made rather than in bursts)."""

    aio: object  # asyncio.AbstractEventLoop
    put: Callable[[object], None]


def _deliver(items: list[tuple[Sink, object]]) -> None:
    for sink, item in items:
        sink.put(item)


@dataclass(frozen=True, slots=True)
class _Add:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    sink: Sink


@dataclass(frozen=True, slots=True)
class _Abort:
    request_id: str


_STOP = object()


class Driver:
    def __init__(self, make_loop: Callable[[], object], on_step: Callable[[object], None] | None = None):
        """`make_loop()`: builds the Loop, called on the engine thread (load, warm-up).
        `on_step(stats)`: called on the engine thread after every step (metrics)."""
        self._make_loop = make_loop
        self.on_step = on_step
        self.loop = None  # set by start()
        self.stats = None  # the latest LoopStats, replaced whole after each step
        self.failure: str | None = None  # set once the engine has failed; the server then refuses work
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._sinks: dict[str, Sink] = {}
        self._outbox: list[tuple[Sink, object]] = []
        self._ready = threading.Event()
        self._load_error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="kern-engine", daemon=True)

    def start(self) -> None:
        """Start the engine thread; return once it has built the loop (or raise what building
        it raised)."""
        self._thread.start()
        self._ready.wait()
        if self._load_error is not None:
            self._thread.join()
            raise self._load_error

    def stop(self) -> None:
        self._inbox.put(_STOP)
        self._thread.join()

    def submit(self, request_id: str, prompt_ids: list[int], params: SamplingParams, sink: Sink) -> None:
        """Queue a request; `sink` gets Accepted or Refused first, then its Deltas."""
        self._inbox.put(_Add(request_id, prompt_ids, params, sink))

    def abort(self, request_id: str) -> None:
        self._inbox.put(_Abort(request_id))

    def _take(self, item) -> bool:
        """Apply one inbox item; False on stop."""
        if item is _STOP:
            return False
        if isinstance(item, _Abort):
            self._sinks.pop(item.request_id, None)
            self.loop.abort(item.request_id)
        elif self.failure is not None:
            self._send(item.sink, Refused(item.request_id, self.failure, engine_failed=True))
        else:
            try:
                self.loop.add(item.request_id, item.prompt_ids, item.params)
            except KernError as e:
                self._send(item.sink, Refused(item.request_id, str(e)))
            else:
                self._sinks[item.request_id] = item.sink
                self._send(item.sink, Accepted(item.request_id))
        return True

    def _step(self) -> None:
        try:
            deltas = self.loop.step()
        except Exception as e:  # the engine is broken: tell every waiting request, refuse new ones
            self.failure = f"the engine failed: {e}"
            for rid, sink in self._sinks.items():
                self._send(sink, Refused(rid, self.failure, engine_failed=True))
            self._sinks.clear()
            return
        for d in deltas:
            sink = self._sinks.get(d.request_id)
            if sink is not None:
                self._send(sink, d)
                if d.finish_reason is not None:
                    del self._sinks[d.request_id]

    def _send(self, sink: Sink, item) -> None:
        self._outbox.append((sink, item))

    def _flush(self) -> None:
        by_loop: dict[object, list[tuple[Sink, object]]] = {}
        for sink, item in self._outbox:
            by_loop.setdefault(sink.aio, []).append((sink, item))
        self._outbox = []
        for aio, items in by_loop.items():
            aio.call_soon_threadsafe(_deliver, items)

    def _busy(self) -> bool:
        return self.failure is None and self.loop.has_work()

    def _run(self) -> None:
        try:
            self.loop = self._make_loop()
            self.stats = self.loop.stats()
        except BaseException as e:  # noqa: BLE001 - handed to start() on the caller's thread
            self._load_error = e
            return
        finally:
            self._ready.set()
        while True:
            # Block only when idle; otherwise take whatever arrived since the last step.
            items = [] if self._busy() else [self._inbox.get()]
            while True:
                try:
                    items.append(self._inbox.get_nowait())
                except queue.Empty:
                    break
            if not all([self._take(i) for i in items]):
                return
            if self._busy():
                self._step()
            self._flush()
            self.stats = self.loop.stats()
            if self.on_step is not None:
                self.on_step(self.stats)
