"""kern test's and kern bench's whole view of an engine: run a call range of a program, read and write flat
prefixes of buffers and states as host numpy arrays, keyed by name.

Only the Device protocol's lower / read / write / synchronize are used, so a span recorded on the
cpu device replays on any device. Paged states are read and written as a prefix of pages:
the workload uses pages [0, pages_used) only."""

from __future__ import annotations

from math import prod

import numpy as np

from ..manifest.expr import evaluate
from ..runtime.device import Program
from ..runtime.dtypes import NP
from ..runtime.engine import Engine
from ..runtime.lower import LoweredLaunch, StateRef, View
from ..manifest.protocol import verify_problem
from .script import Bounds


def poison(dtype: str, n: int) -> np.ndarray:
    """What an unwritten element looks like: NaN for floats, the extreme value for integers."""
    t = np.dtype(NP[dtype])
    if t.kind == "f" or dtype in ("bf16",):
        return np.full(n, np.nan, dtype=t)
    info = np.iinfo(t)
    return np.full(n, info.min if info.min < 0 else info.max, dtype=t)


class EngineIO:
    def __init__(self, engine: Engine):
        self.e = engine
        self._segments: dict[tuple[str, int, int], Program | None] = {}
        self._launches: dict[tuple[str, int, int], list[LoweredLaunch]] = {}

    # ---- launches -------------------------------------------------------------------------
    def launches(self, program: str, lo: int, hi: int) -> list[LoweredLaunch]:
        """Calls [lo, hi)'s launches (one list a range, kept: callers never change it)."""
        key = (program, lo, hi)
        ls = self._launches.get(key)
        if ls is None:
            ls = self._launches[key] = [l for l in self.e.launches[program] if lo <= l.call < hi]
        return ls

    def run_calls(self, program: str, lo: int, hi: int, env: dict[str, int]) -> list[LoweredLaunch]:
        """Run calls [lo, hi) of a program; returns their launches."""
        if hi <= lo:
            return []
        key = (program, lo, hi)
        ls = self.launches(program, lo, hi)
        if key not in self._segments:
            self._segments[key] = self.e.device.lower(ls, self.e.buffers, self.e.states) if ls else None
        seg = self._segments[key]
        if seg is not None:
            seg.run(env)
            self.e.device.synchronize()
        return ls

    def run_launches(self, ls: list[LoweredLaunch], env: dict[str, int]) -> None:
        """Run launches made here (not the program's own, so not cached)."""
        if ls:
            self.e.device.lower(ls, self.e.buffers, self.e.states).run(env)
            self.e.device.synchronize()

    # ---- sizes ----------------------------------------------------------------------------
    def dtype(self, buf: str) -> str:
        return self.e.m.buffers[buf].dtype

    def extent(self, buf: str, env: dict[str, int], launches: list[LoweredLaunch] = ()) -> int:
        """Elements of a buffer a step can touch: its step shape, or the farthest view."""
        n = prod(self.e.shape(buf, env))
        for l in launches:
            for a in l.args:
                if isinstance(a, View) and a.buffer == buf:
                    n = max(n, evaluate(a.offset, env) + prod(evaluate(d, env) for d in a.shape))
        return min(n, prod(self.e.shapes[buf]))

    @staticmethod
    def written(launches: list[LoweredLaunch], env: dict[str, int]) -> dict[str, list[tuple[int, int]]]:
        """Element intervals each buffer is written on, from the launches' declared writes."""
        out: dict[str, list[tuple[int, int]]] = {}
        for l in launches:
            for i in l.writes:
                a = l.args[i]
                if isinstance(a, View):
                    lo = evaluate(a.offset, env)
                    out.setdefault(a.buffer, []).append((lo, lo + prod(evaluate(d, env) for d in a.shape)))
        return {b: _merge(iv) for b, iv in out.items()}

    @staticmethod
    def states_written(launches: list[LoweredLaunch]) -> set[str]:
        return {l.args[i].state for l in launches for i in l.writes if isinstance(l.args[i], StateRef)}

    # ---- host copies ----------------------------------------------------------------------
    def read(self, buf: str, n: int) -> np.ndarray:
        n = min(n, prod(self.e.shapes[buf]))
        return self.e.device.read(self.e.buffers[buf], self.dtype(buf), (n,))

    def write(self, buf: str, host: np.ndarray) -> np.ndarray:
        """Write a flat prefix (cast through f32 to this side's dtype); returns what was written."""
        t = np.dtype(NP[self.dtype(buf)])
        n = min(host.size, prod(self.e.shapes[buf]))
        x = host[:n]
        if x.dtype != t:
            x = x.astype(np.float32).astype(t) if x.dtype.kind == "f" or t.kind == "f" else x.astype(t)
        x = np.ascontiguousarray(x)
        self.e.device.write(self.e.buffers[buf], x)
        return x

    def write_at(self, buf: str, host: np.ndarray, offset: int) -> None:
        """Write host (this side's dtype) at an element offset."""
        self.e.device.write(self.e.buffers[buf], np.ascontiguousarray(host), offset)

    def state_prefix(self, state: str, pages: int, slots: int) -> int:
        """Bytes of a state a workload of `pages` pages and `slots` sequences (slots [0, slots)) touches."""
        if state in self.e.pages:
            return pages * self.e.page_bytes(state)
        if self.e.m.states[state].bytes_per_seq is not None:
            return slots * self.e.state_bytes[state]
        return self.e.state_bytes[state]

    def read_state(self, state: str, nbytes: int) -> np.ndarray:
        return self.e.device.read(self.e.states[state], "u8", (nbytes,))

    def write_state(self, state: str, data: np.ndarray) -> None:
        self.e.device.write(self.e.states[state], np.ascontiguousarray(data))

    # ---- the workload's bounds ------------------------------------------------------------
    def limits(self) -> Bounds:
        p = self.e.protocol
        env = self.e.max_env
        ragged = [s for s in p.steppers if s.ragged]
        single = [s for s in p.steppers if s.rows == 1]
        any_st = (ragged or single or list(p.steppers))[0]
        vocab = (0, 2 ** 31 - 1)
        context = 2 ** 31 - 1
        for st in p.steppers:
            for role, buf in st.inputs.items():
                d = self.e.m.buffers[buf].domain
                if d is not None and d.range is not None:
                    lo, hi = evaluate(d.range[0], env), evaluate(d.range[1], env)
                    if role == "token":
                        vocab = (max(vocab[0], lo), min(vocab[1], hi))
                    if role == "position":
                        context = min(context, hi)
        tables = [pt for st in p.steppers for pt in st.page_tables]
        width = min((self.e.shapes[pt.buffer][-1] for pt in tables), default=1 << 20)
        page_tokens = tables[0].page_tokens if tables else 1 << 20
        pages = min((self.e.pages[pt.state] for pt in tables), default=1 << 20)
        v = p.verify if p.verify is not None and verify_problem(p.verify) is None else None
        return Bounds(vocab, page_tokens, ragged[0].rows_max if ragged else 1,
                      ragged[0].groups_max if ragged else 1,
                      single[0].groups_max if single else any_st.groups_max, context, width, pages,
                      v.groups_max if v else 0, v.rows_max if v else 0,
                      ragged[0].keys_max if ragged and ragged[0].keys_var else None)

    def table_widths(self) -> dict[str, int]:
        return {pt.buffer: self.e.shapes[pt.buffer][-1] for st in self.e.protocol.every for pt in st.page_tables}


def _merge(iv: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(iv):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out
