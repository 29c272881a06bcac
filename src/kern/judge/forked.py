"""Run pieces of the reference's work in forked children, beside the rest.

A cpu reference's record, its replays against itself and in the candidate's precision, its
end-to-end floor and the candidate's own run are independent but for the record they share:
each child gets the parent's memory as it is at the fork (the engine as loaded) copy-on-write,
and the record, as the parent makes it, through a `Feed` (each span record pickled once, an
array shared by two records sent once), so the replays run while the record is being made. Each
piece computes exactly what it would in sequence (its own seeded generator, the same inputs), so
the verdict is the same either way; only the wall time differs.

Only numpy work runs in a child: a child never touches a device API (a CUDA context does not
survive a fork), and leaves with os._exit so that nothing inherited is torn down twice."""

from __future__ import annotations

import io
import os
import pickle
import queue
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")
_END = "end"


# the pieces (record, two replays, the end-to-end floor, the candidate) need a core each to gain:
# on fewer, they run in sequence
MIN_CORES = 4


def worth_it() -> bool:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return hasattr(os, "fork") and cores >= MIN_CORES


class Feed:
    """Messages for forked children, sent as the parent makes them: pickled once with one memo
    (an object sent twice is sent once), queued, written to each child's pipe by a thread so the
    parent never waits for a slow reader."""

    def __init__(self) -> None:
        self._buf = io.BytesIO()
        self._pickler = pickle.Pickler(self._buf, protocol=pickle.HIGHEST_PROTOCOL)
        self._writes: list[int] = []
        self._queues: list[queue.SimpleQueue] = []

    def pipe(self) -> int:
        """A new child's read end (before its fork)."""
        r, w = os.pipe()
        self._writes.append(w)
        return r

    def in_child(self) -> None:
        for w in self._writes:  # a reader must see the end of its pipe when the parent closes it
            os.close(w)

    def start(self) -> None:
        """After the forks: one writer thread a pipe."""
        for w in self._writes:
            q: queue.SimpleQueue = queue.SimpleQueue()
            threading.Thread(target=_write, args=(w, q), daemon=True).start()
            self._queues.append(q)

    def send(self, msg: Any) -> None:
        self._pickler.dump(msg)
        data = self._buf.getvalue()
        self._buf.seek(0)
        self._buf.truncate()
        for q in self._queues:
            q.put(data)

    def abort(self) -> None:
        """Give up: every reader sees the end of its pipe (before start() too)."""
        if self._queues:
            for q in self._queues:
                q.put(None)
        else:
            for w in self._writes:
                os.close(w)
        self._writes, self._queues = [], []

    def close(self) -> None:
        self.send((_END,))
        for q in self._queues:
            q.put(None)


def _write(fd: int, q: queue.SimpleQueue) -> None:
    with os.fdopen(fd, "wb") as f:
        try:
            while (data := q.get()) is not None:
                f.write(data)
        except BrokenPipeError:  # the child has died: its result says so
            pass


def inbox(fd: int) -> Iterator[Any]:
    """A child's messages from its parent's Feed, in order, until the end."""
    with os.fdopen(fd, "rb") as f:
        u = pickle.Unpickler(f)
        while True:
            try:
                msg = u.load()
            except EOFError:
                return
            if msg[0] == _END:
                return
            yield msg


class Part(Generic[T]):
    """A result being computed: in a child when `fork` (fn gets the Feed's messages when a feed
    is given), else at once."""

    def __init__(self, fn: Callable[..., T], fork: bool, feed: Feed | None = None):
        self._pid, self._fd, self._value, self._error = 0, -1, None, ""
        if not fork:
            self._value = fn()
            return
        rfeed = feed.pipe() if feed is not None else -1
        r, w = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        with warnings.catch_warnings():
            # Python warns about forking a process with threads (BLAS's pool, a device
            # driver's): the child runs numpy alone, and OpenBLAS rebuilds its pool at a fork
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # the child: whatever happens, it never returns into the parent's code
            code = 1
            try:
                os.close(r)
                try:
                    if feed is not None:
                        feed.in_child()
                    value = fn(inbox(rfeed)) if feed is not None else fn()
                    data, code = pickle.dumps(("ok", value), protocol=pickle.HIGHEST_PROTOCOL), 0
                except BaseException as exc:  # noqa: BLE001 - the parent raises it, in its own words
                    data = pickle.dumps(("error", f"{type(exc).__name__}: {exc}"))
                with os.fdopen(w, "wb") as f:
                    f.write(data)
            finally:
                os._exit(code)
        os.close(w)
        if rfeed >= 0:
            os.close(rfeed)
        self._pid, self._fd = pid, r

    def result(self) -> T:
        if self._fd >= 0:
            with os.fdopen(self._fd, "rb") as f:
                data = f.read()
            self._fd = -1
            os.waitpid(self._pid, 0)
            kind, value = pickle.loads(data) if data else ("error", "the child process died")
            if kind == "ok":
                self._value = value
            else:
                self._error = value
        if self._error:
            raise RuntimeError(self._error)
        return self._value  # type: ignore[return-value]
