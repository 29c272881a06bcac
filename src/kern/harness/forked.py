"""Run a piece of the reference's work in a forked child, beside the rest.

A cpu reference's record, its replays against itself and in the candidate's precision, and the
candidate's own run are independent once the record exists: each child gets the parent's memory
as it is at the fork (the engine, the recording) copy-on-write, computes its part and sends the
result back pickled. Each part computes exactly what it would in sequence (its own seeded
generator, the same inputs), so the verdict is the same either way; only the wall time differs.

Only numpy work runs in a child: a child never touches a device API (a CUDA context does not
survive a fork), and leaves with os._exit so that nothing inherited is torn down twice."""

from __future__ import annotations

import os
import pickle
import sys
import warnings
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Part(Generic[T]):
    """A result being computed: in a child when the platform forks, else at once."""

    def __init__(self, fn: Callable[[], T], fork: bool):
        self._pid, self._fd, self._value, self._error = 0, -1, None, ""
        if not (fork and hasattr(os, "fork")):
            self._value = fn()
            return
        r, w = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        with warnings.catch_warnings():
            # Python warns about forking a process with threads (BLAS's pool, a device
            # driver's): the child runs numpy alone, and OpenBLAS rebuilds its pool at a fork
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # the child
            os.close(r)
            code = 0
            try:
                data = pickle.dumps(("ok", fn()), protocol=pickle.HIGHEST_PROTOCOL)
            except BaseException as exc:  # noqa: BLE001 - the parent raises it, in its own words
                data, code = pickle.dumps(("error", f"{type(exc).__name__}: {exc}")), 1
            with os.fdopen(w, "wb") as f:
                f.write(data)
            os._exit(code)
        os.close(w)
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
