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
