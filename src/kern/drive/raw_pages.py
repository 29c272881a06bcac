"""Stepping a model by hand, below the host loop (parity tests, device tests, benchmarks): lease
pages without caching, run rows of one sequence through a program, give the pages back. A model
is a kern.api.Model, or anything with its paging, protocol and engine."""

from __future__ import annotations

import weakref

import numpy as np

_BY_MODEL: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def raw(model) -> "RawPages":
    """The model's one RawPages (pages taken from it must be given back to it)."""
    if model not in _BY_MODEL:
        _BY_MODEL[model] = RawPages(model)
    return _BY_MODEL[model]


class RawPages:
    def __init__(self, model):
        self.model = model
        self.paging, self.state, self.page_tokens = model.paging, model.paging.state, model.paging.page_tokens
        self._leases: dict[tuple[int, ...], object] = {}

    def take(self, k: int) -> list[int]:
        """k pages leased from the pool without caching."""
        n = k * self.page_tokens
        lease = self.paging.lease([], n, cache=False).lease
        self.paging.extend(lease, [0] * n)
        pages = list(lease.page_table(self.state))
        self._leases[tuple(pages)] = lease
        return pages

    def give(self, pages: list[int]) -> None:
        self.paging.pool.free(self._leases.pop(tuple(pages)))

    def step_rows(self, ids: list[int], start: int, pages: list[int], ragged: bool = False):
        """Run `ids` at positions start.. of one sequence; return (next token, logits).
        One row goes through the decode program unless ragged (prefill) is asked for."""
        m = self.model
        st = m.protocol.for_rows(1, None if ragged or len(ids) > 1 else 1)
        inputs = {st.inputs["token"]: np.array(ids, np.int32),
                  st.inputs["position"]: np.arange(start, start + len(ids), dtype=np.int32)}
        for pt in st.page_tables:
            row = np.zeros((1, m.engine.shapes[pt.buffer][1]), np.int32)
            row[0, :len(pages)] = pages
            inputs[pt.buffer] = row
        for si in st.slots:
            inputs[si.buffer] = np.array([self._leases[tuple(pages)].slot(si.state)], np.int32)
        if "seq_len" in st.inputs:
            inputs[st.inputs["seq_len"]] = np.array([start + len(ids)], np.int32)
        if "cu_seqlens" in st.inputs:
            inputs[st.inputs["cu_seqlens"]] = np.array([0, len(ids)], np.int32)
        env = m.engine.run(st.program, st.vars_for(1, len(ids), reach=start + len(ids)), inputs)
        tok = int(m.engine.read(st.outputs["tokens"], env)[0])
        logits = m.engine.read(st.outputs["logits"], env)[0] if "logits" in st.outputs else None
        return tok, logits

    def step_many(self, seqs: list[list[int]], starts: list[int], pages: list[list[int]],
                  ragged: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
        """One step of several sequences together: sequence i's rows `seqs[i]` at positions
        starts[i].. in its pages. Decode (one row each) unless ragged: one prefill step of every
        row, cu_seqlens between them. Returns the step's tokens and logits as its outputs hold
        them (a row a sequence, its last, where the logits output is laid out by sequence)."""
        m = self.model
        n = len(seqs)
        st = m.protocol.for_rows(n, None if ragged else 1)
        inputs = {st.inputs["token"]: np.array([t for s in seqs for t in s], np.int32),
                  st.inputs["position"]: np.array([a + j for s, a in zip(seqs, starts) for j in range(len(s))],
                                                  np.int32)}
        for pt in st.page_tables:
            table = np.zeros((n, m.engine.shapes[pt.buffer][1]), np.int32)
            for i, pg in enumerate(pages):
                table[i, :len(pg)] = pg
            inputs[pt.buffer] = table
        for si in st.slots:
            inputs[si.buffer] = np.array([self._leases[tuple(pg)].slot(si.state) for pg in pages], np.int32)
        if "seq_len" in st.inputs:
            inputs[st.inputs["seq_len"]] = np.array([a + len(s) for s, a in zip(seqs, starts)], np.int32)
        if "cu_seqlens" in st.inputs:
            inputs[st.inputs["cu_seqlens"]] = np.cumsum([0] + [len(s) for s in seqs], dtype=np.int32)
        rows = sum(map(len, seqs))
        reach = max(a + len(s) for s, a in zip(seqs, starts))
        env = m.engine.run(st.program, st.vars_for(n, rows, reach=reach), inputs)
        logits = m.engine.read(st.outputs["logits"], env) if "logits" in st.outputs else None
        return m.engine.read(st.outputs["tokens"], env), logits
