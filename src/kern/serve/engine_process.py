"""The engine process: the one owner of the (single-threaded) Loop, apart from the API process.

It builds the loop itself (load, warm-up: a device context belongs to the process that made
it, which is why the API process spawns this one rather than forking), then takes requests
and aborts from its pipe and steps the loop while there is work, sending each step's Deltas up
as one message. Aborts are taken before the next step, so a client that goes away frees its
lease within one step. It lives as long as its pipe: a Stop, or the API process gone (EOF),
ends it. Ctrl-C in a terminal reaches the whole process group; the API process stops this one
in order, so it ignores SIGINT."""

from __future__ import annotations

import pickle
import signal
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

from ..errors import KernError
from . import wire

if TYPE_CHECKING:
    from ..generation.loop import Loop


def main(make_loop: Callable[[], Loop], down: Connection, up: Connection) -> None:
    """The process's target: build the loop, say Ready (or LoadFailed), serve until stopped."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        loop = make_loop()
        tok = loop.tokenizer
        vocab = tok.tok.get_vocab_size(with_added_tokens=True) if tok is not None else 0
        ready = wire.Ready(loop.model_name, loop.context, tok, vocab, wire.pack_stats(loop.stats()))
    except BaseException as e:  # noqa: BLE001 - re-raised by Driver.start in the API process
        up.send(wire.LoadFailed(_portable(e)))
        return
    up.send(ready)
    try:
        Serving(loop, up).run(down)
    except (EOFError, OSError):  # the API process is gone: nobody is left to serve
        pass


def _portable(e: BaseException) -> wire.Raised:
    """`e` as the API process can raise it again, with this process's traceback as a note
    (str(e), the one line a user sees, stays as it is)."""
    e.add_note("in the engine process:\n" + "".join(traceback.format_exception(e)).rstrip())
    raised = wire.Raised.of(e)
    try:
        pickle.loads(pickle.dumps(raised)).rebuild()
        return raised
    except Exception:  # noqa: BLE001 - a type or attribute that does not pickle: its words do
        out = KernError(str(e))
        out.__notes__ = e.__notes__
        return wire.Raised.of(out)


class Serving:
    """The engine process's side of the pipes: requests and aborts in, each step's Deltas out."""

    def __init__(self, loop: Loop, up: Connection):
        self.loop, self.up = loop, up
        self.open: set[str] = set()  # requests added and not finished
        self.failure: str | None = None
        self._accepted: list[str] = []
        self._refused: list[tuple[str, str, bool]] = []

    def busy(self) -> bool:
        return self.failure is None and self.loop.has_work()

    def run(self, down: Connection) -> None:
        while True:
            # Block only when idle; otherwise take whatever arrived since the last step.
            items = [] if self.busy() else [down.recv()]
            while down.poll():
                items.append(down.recv())
            for item in items:
                if isinstance(item, wire.Stop):
                    return
                self.take(item)
            deltas = self.step() if self.busy() else []
            self.up.send(wire.Step(self._accepted, self._refused, deltas, wire.pack_stats(self.loop.stats()),
                                   self.failure))
            self._accepted, self._refused = [], []

    def take(self, item) -> None:
        if isinstance(item, wire.Abort):
            self.open.discard(item.request_id)
            self.loop.abort(item.request_id)
        elif isinstance(item, wire.Query):
            try:
                self.up.send(wire.QueryResult(item.key, item.fn(self.loop), None))
            except Exception as e:  # noqa: BLE001 - the asker gets it
                self.up.send(wire.QueryResult(item.key, None, _portable(e)))
        elif self.failure is not None:
            self._refused.append((item.request_id, self.failure, True))
        else:
            try:
                self.loop.add(item.request_id, item.prompt_ids, item.params)
            except KernError as e:
                self._refused.append((item.request_id, str(e), False))
            else:
                self.open.add(item.request_id)
                self._accepted.append(item.request_id)

    def step(self) -> list[tuple]:
        """One step of the loop: its Deltas, packed. A run-ahead's steps before the last go up
        as they land, each its own Step message (a stream's tokens reach its client one by one)."""
        try:
            deltas = self.loop.step(self._emit)
        except Exception as e:  # noqa: BLE001 - the engine is broken: tell every open request, refuse new ones
            self.failure = f"the engine failed: {e}"
            self._refused += [(rid, self.failure, True) for rid in sorted(self.open)]
            self.open.clear()
            return []
        return self._pack(deltas)

    def _emit(self, deltas: list) -> None:
        self.up.send(wire.Step(self._accepted, self._refused, self._pack(deltas), wire.pack_stats(self.loop.stats()),
                               self.failure))
        self._accepted, self._refused = [], []

    def _pack(self, deltas: list) -> list[tuple]:
        out = []
        for d in deltas:
            if d.request_id in self.open:
                out.append(wire.pack_delta(d))
                if d.finish_reason is not None:
                    self.open.discard(d.request_id)
        return out
