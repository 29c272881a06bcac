"""A state's history on the reference, stored as chunk deltas.

A KV cache is tens of MB while one call changes a few KB of it, so a span's pre- and
post-images of a state are versions on a tape: version v = zeros + the first v deltas, each
delta the chunks that changed. Versions are read back in order (replay walks spans in order)."""

from __future__ import annotations

import numpy as np


def _chunk(nbytes: int, want: int = 4096) -> int:
    c = want
    while c > 1 and nbytes % c:
        c //= 2
    return c


class Tape:
    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        self.chunk = _chunk(nbytes)
        self.cur = np.zeros(nbytes, np.uint8)
        self.deltas: list[tuple[np.ndarray, np.ndarray]] = []

    @property
    def version(self) -> int:
        return len(self.deltas)

    @property
    def stored(self) -> int:
        return sum(d.nbytes for _, d in self.deltas)

    def _rows(self, x: np.ndarray) -> np.ndarray:
        if self.chunk % 8 == 0:
            return x.view(np.uint64).reshape(-1, self.chunk // 8)
        return x.reshape(-1, self.chunk)

    def snap(self, data: np.ndarray) -> int:
        """Record the state's bytes now; returns their version."""
        a, b = self._rows(self.cur), self._rows(data)
        changed = np.flatnonzero((a != b).any(axis=1))
        if changed.size:
            rows = b[changed].copy()
            self.deltas.append((changed, rows))
            a[changed] = rows
        return self.version

    def add(self, changed: np.ndarray, rows: np.ndarray) -> None:
        """A delta another tape's snap made (a copy of a tape kept in another process)."""
        self.deltas.append((changed, rows))
        self._rows(self.cur)[changed] = rows

    def reader(self) -> "TapeReader":
        return TapeReader(self)


class TapeReader:
    """Materializes versions in increasing order."""

    def __init__(self, tape: Tape):
        self.tape = tape
        self.cur = np.zeros(tape.nbytes, np.uint8)
        self.v = 0

    def at(self, version: int) -> np.ndarray:
        if version < self.v:
            raise ValueError(f"tape versions are read in order: at {self.v}, asked {version}")
        rows = self.tape._rows(self.cur)
        for idx, data in self.tape.deltas[self.v:version]:
            rows[idx] = data
        self.v = version
        return self.cur
