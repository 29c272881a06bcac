"""The API process's side of the engine process: the Loop's interface over two pipes.

The engine runs in a process of its own (engine_process.py), so its host work never holds the
GIL that the event loop's JSON and SSE work needs. Requests and aborts go down one pipe from a
writer thread (a full pipe never blocks the event loop); each step comes up as one message,
read on the event loop itself (`attach`: a reader callback on the pipe, no thread hand-off)
and routed to the requests' sinks: each sink is called once per step with everything the step
made for it. An engine that fails says so in its step; one that dies is noticed at the pipe's
end; either way every waiting request is refused and new ones are refused from then on."""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import KernError
from ..generation.params import SamplingParams
from . import engine_process, wire

if TYPE_CHECKING:
    from ..generation.loop import Loop
    from ..generation.outputs import LoopStats

STOP_TIMEOUT_S = 30.0  # for the engine process to finish its step and exit, before it is killed


@dataclass(frozen=True, slots=True)
class Accepted:
    """The loop queued the request."""

    request_id: str


@dataclass(frozen=True, slots=True)
class Refused:
    """The loop refused the request (it can never run) or the engine failed: the message."""

    request_id: str
    message: str
    engine_failed: bool = False  # a 503: the server cannot serve it (`code` says why), not a bad request
    code: str = "engine_failed"


Sink = Callable[[list], None]  # called on the event loop with one step's items for a request, in order


class Driver:
    """The API process's handle on the engine process's Loop."""

    def __init__(self, make_loop: Callable[[], Loop], on_step: Callable[[LoopStats], None] | None = None):
        """`make_loop()`: builds the Loop in the engine process (load, warm-up); it must pickle
        (a module-level function or a functools.partial of one). `on_step(stats)`: called on
        the event loop with each step's LoopStats (metrics)."""
        self._make_loop = make_loop
        self.on_step = on_step
        self.info: wire.Ready | None = None  # model name, context, tokenizer, vocab: set by start()
        self.stats: LoopStats | None = None  # the latest, replaced whole after each step
        self.failure: str | None = None  # set once the engine has failed; the server then refuses work
        self.closing: str | None = None  # set once the server stops: new requests are refused with it
        self._sinks: dict[str, Sink] = {}
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._queries: dict[int, Future] = {}
        self._keys = itertools.count()
        self._aio: asyncio.AbstractEventLoop | None = None
        self._stopping = False
        self._gone = False  # the engine process ended

    def start(self) -> None:
        """Spawn the engine process; return once it has built the loop (or raise what building
        it raised, as it was raised)."""
        ctx = multiprocessing.get_context("spawn")  # a device context must not be forked
        down_r, self._down = ctx.Pipe(duplex=False)
        self._up, up_w = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(target=engine_process.main, args=(self._make_loop, down_r, up_w),
                                 name="kern-engine", daemon=True)
        self._proc.start()
        down_r.close()
        up_w.close()
        try:
            first = self._up.recv()
        except (EOFError, OSError):
            self._proc.join()
            raise KernError(f"the engine process exited while starting (exit code {self._proc.exitcode})") from None
        if isinstance(first, wire.LoadFailed):
            self._proc.join()
            raise first.error.rebuild()
        self.info, self.stats = first, wire.unpack_stats(first.stats)
        self._writer = threading.Thread(target=self._write, name="kern-engine-writer", daemon=True)
        self._writer.start()

    @property
    def pid(self) -> int:
        """The engine process's id."""
        return self._proc.pid

    def attach(self, aio: asyncio.AbstractEventLoop) -> None:
        """Read the engine's messages on this event loop (call it there, at start-up)."""
        self._aio = aio
        aio.add_reader(self._up.fileno(), self._read)

    def detach(self) -> None:
        if self._aio is not None and not self._aio.is_closed():
            self._aio.remove_reader(self._up.fileno())
        self._aio = None

    def stop(self) -> None:
        """Stop the engine process (it finishes its step first) and wait for it."""
        self._stopping = True
        self.detach()
        self._outbox.put(wire.Stop())
        self._proc.join(0)
        while self._proc.is_alive():  # keep reading, so an engine blocked on a full pipe gets to the Stop
            try:
                if self._up.poll(0.05):
                    self._up.recv()
            except (EOFError, OSError):
                break
            if not self._proc.is_alive():
                break
        self._proc.join(STOP_TIMEOUT_S)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()
        self._writer.join()

    def submit(self, request_id: str, prompt_ids: list[int], params: SamplingParams, sink: Sink) -> None:
        """Queue a request; `sink` gets Accepted or Refused first, then its Deltas."""
        if self._gone:
            sink([Refused(request_id, self.failure, engine_failed=True)])
            return
        if self.closing is not None:
            sink([Refused(request_id, self.closing, engine_failed=True, code="shutting_down")])
            return
        self._sinks[request_id] = sink
        self._outbox.put(wire.AddRequest(request_id, prompt_ids, params))

    @property
    def in_flight(self) -> int:
        """Sequences submitted and not finished."""
        return len(self._sinks)

    def close_streams(self, message: str) -> int:
        """The server is stopping: refuse new requests with `message` from now on and end every
        open one with it (a 503 body, or an error event and [DONE] in a stream), its sequences
        aborted. Returns how many sequences were cut."""
        self.closing = self.closing or message
        sinks, self._sinks = self._sinks, {}
        for rid, sink in sinks.items():
            self._outbox.put(wire.Abort(rid))
            sink([Refused(rid, message, engine_failed=True, code="shutting_down")])
        return len(sinks)

    def abort(self, request_id: str) -> None:
        self._sinks.pop(request_id, None)
        self._outbox.put(wire.Abort(request_id))

    def query(self, fn: Callable[[Loop], Any], timeout: float = 60.0) -> Any:
        """fn(loop), run in the engine process between steps; call it from a thread other than
        the event loop's (tests read the pool's books with it)."""
        key = next(self._keys)
        self._queries[key] = fut = Future()
        self._outbox.put(wire.Query(key, fn))
        return fut.result(timeout)

    def _write(self) -> None:
        while True:
            item = self._outbox.get()
            try:
                self._down.send(item)
            except OSError:  # the engine process is gone; the reader says so
                return
            if isinstance(item, wire.Stop):
                return

    def _read(self) -> None:
        try:
            while self._up.poll():
                msg = self._up.recv()
                if isinstance(msg, wire.Step):
                    self._route(msg)
                else:
                    self._answer(msg)
        except (EOFError, OSError):
            self._lost()

    def _route(self, step: wire.Step) -> None:
        sinks, out = self._sinks, {}
        for rid in step.accepted:
            if (sink := sinks.get(rid)) is not None:
                out.setdefault(sink, []).append(Accepted(rid))
        for rid, message, failed in step.refused:
            if (sink := sinks.pop(rid, None)) is not None:
                out.setdefault(sink, []).append(Refused(rid, message, failed))
        for t in step.deltas:
            d = wire.unpack_delta(t)
            if (sink := sinks.get(d.request_id)) is not None:
                out.setdefault(sink, []).append(d)
                if d.finish_reason is not None:
                    del sinks[d.request_id]
        if step.failure is not None:
            self.failure = step.failure
        self.stats = wire.unpack_stats(step.stats)
        if self.on_step is not None:
            self.on_step(self.stats)
        for sink, items in out.items():
            sink(items)

    def _answer(self, r: wire.QueryResult) -> None:
        fut = self._queries.pop(r.key)
        if r.error is not None:
            fut.set_exception(r.error.rebuild())
        else:
            fut.set_result(r.value)

    def _lost(self) -> None:
        """The engine process ended without being asked to: refuse everything, from now on too."""
        self.detach()
        self._gone = True
        if self._stopping:
            return
        self._proc.join(5)
        self.failure = f"the engine process exited unexpectedly (exit code {self._proc.exitcode})"
        sinks, self._sinks = self._sinks, {}
        for rid, sink in sinks.items():
            sink([Refused(rid, self.failure, engine_failed=True)])
        for fut in self._queries.values():
            fut.set_exception(KernError(self.failure))
        self._queries.clear()
