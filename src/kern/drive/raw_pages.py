"""Stepping a model by hand, below the host loop (parity tests, device tests, benchmarks): lease
pages without caching, run rows of one sequence through a program, give the pages back; or
greedy-decode a batch of sequences, each on a lease of its own (greedy: the page tables and the
`slot` inputs filled from the leases as the host loop fills them, lease_inputs). A model is a
kern.api.Model, or anything with its paging, protocol and engine."""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass

import numpy as np

from ..manifest.protocol import PROMPT_ALL

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
        lease = lease_many(self.model, 1, k * self.page_tokens)[0]
        pages = list(lease.page_table(self.state))
        self._leases[tuple(pages)] = lease
        return pages

    def give(self, pages: list[int]) -> None:
        self.paging.pool.free(self._leases.pop(tuple(pages)))

    def step_rows(self, ids: list[int], start: int, pages: list[int], ragged: bool = False):
        """Run `ids` at positions start.. of one sequence; return (next token, logits).
        One row goes through the decode program unless ragged (prefill) is asked for."""
        m = self.model
        st, vars_, inputs = step_inputs(m, [ids], [start], [self._leases[tuple(pages)]], ragged or len(ids) > 1)
        env = m.engine.run(st.program, vars_, inputs)
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
        st, vars_, inputs = step_inputs(m, seqs, starts, [self._leases[tuple(pg)] for pg in pages], ragged)
        env = m.engine.run(st.program, vars_, inputs)
        logits = m.engine.read(st.outputs["logits"], env) if "logits" in st.outputs else None
        return m.engine.read(st.outputs["tokens"], env), logits


def step_inputs(model, seqs: list[list[int]], starts: list[int], leases: list, ragged: bool = False):
    """One step of sequences `seqs` (each its rows' token ids) at positions starts[i].., each
    on its lease: (the protocol's stepper, its vars, its inputs), filled as the host loop fills
    them. Decode (one row each) unless ragged: one prefill step, cu_seqlens between them."""
    n = len(seqs)
    st = model.protocol.for_rows(n, None if ragged else 1)
    inputs = {st.inputs["token"]: np.array([t for s in seqs for t in s], np.int32),
              st.inputs["position"]: np.array([a + j for s, a in zip(seqs, starts) for j in range(len(s))], np.int32),
              **lease_inputs(model, st, leases)}
    if "seq_len" in st.inputs:
        inputs[st.inputs["seq_len"]] = np.array([a + len(s) for s, a in zip(seqs, starts)], np.int32)
    if "cu_seqlens" in st.inputs:
        inputs[st.inputs["cu_seqlens"]] = np.cumsum([0] + [len(s) for s in seqs], dtype=np.int32)
    if "prompt_len" in st.inputs:  # a driver's rows are all prompt tokens
        inputs[st.inputs["prompt_len"]] = np.full(n, PROMPT_ALL, np.int32)
    reach = max(a + len(s) for s, a in zip(seqs, starts))
    return st, st.vars_for(n, sum(map(len, seqs)), reach=reach), inputs


# ---- many sequences on leases of their own ------------------------------------------------
# What a benchmark steps below the host loop (bench/kimi_gpu.py's decode): a batch of sequences
# each on a lease of its own, prefilled together from position 0, then decoded together.

def lease_many(model, n: int, reserve: int) -> list:
    """n leases of `reserve` tokens each, without caching, every page bound (raw pages' take)."""
    leases = []
    try:
        for _ in range(n):
            lease = model.paging.lease([], reserve, cache=False).lease
            leases.append(lease)
            model.paging.extend(lease, [0] * reserve)
    except BaseException:
        give_many(model, leases)
        raise
    return leases


def give_many(model, leases: list) -> None:
    for lease in leases:
        model.paging.pool.free(lease)


def lease_inputs(model, st, leases: list) -> dict[str, np.ndarray]:
    """A step's page tables and `slot` inputs for `leases` (a lease a sequence, in the step's
    order), as the host loop fills them (generation/runner.py): every page table a row a lease,
    every slot input (`st.slots`: the slot role is not among `st.inputs`) each lease's slot of
    its state. A slot input left unwritten keeps what its buffer held (zeros: every row on slot
    0, stepping one recurrence), so each is written here, for every step."""
    inputs = {}
    for pt in st.page_tables:
        table = np.zeros((len(leases), model.engine.shapes[pt.buffer][1]), np.int32)
        for i, lease in enumerate(leases):
            row = lease.page_table(pt.state)
            table[i, :len(row)] = row
        inputs[pt.buffer] = table
    for si in st.slots:
        inputs[si.buffer] = np.array([lease.slot(si.state) for lease in leases], np.int32)
    return inputs


@dataclass
class Greedy:
    """greedy()'s answer: tokens [1 + steps, sequences] (the prefill's, then each decode
    step's), the `rows`' logits a step ({row: [1 + steps, vocab]}; prefill's from the row's
    last prompt position), the prefill's and each decode step's host time in seconds, the
    decode program and its last step's env (to profile it)."""

    tokens: np.ndarray
    logits: dict[int, np.ndarray]
    prefill_s: float
    step_s: list[float]
    program: str
    env: dict[str, int]


def greedy(model, prompts, steps: int, rows: tuple[int, ...] = (), reserve: int | None = None) -> Greedy:
    """Greedy decoding of len(prompts) sequences, each on a fresh lease (lease_many): one
    ragged prefill step of every prompt from position 0, then `steps` decode steps of every
    sequence at once (the program the protocol picks for that many rows), each step's tokens
    read back before the next. The leases are given back at the end. With no sampling inputs
    written, every row draws greedily (temperature 0)."""
    m = model
    prompts = np.asarray(prompts, np.int32)
    b, n = prompts.shape
    out, step_s = [], []
    leases = lease_many(m, b, reserve or n + steps + 8)
    try:
        st, vars_, inputs = step_inputs(m, prompts.tolist(), [0] * b, leases, ragged=True)
        t0 = time.perf_counter()
        env = m.engine.run(st.program, vars_, inputs)
        tok = m.engine.read(st.outputs["tokens"], env)[:b].copy()
        prefill_s = time.perf_counter() - t0
        out.append(tok)
        logits = {r: [m.engine.read_rows(st.outputs["logits"], env, [r])[0]] for r in rows}
        for i in range(steps):
            st, vars_, inputs = step_inputs(m, tok.reshape(-1, 1).tolist(), [n + i] * b, leases)
            t0 = time.perf_counter()
            env = m.engine.run(st.program, vars_, inputs)
            tok = m.engine.read(st.outputs["tokens"], env)[:b].copy()
            step_s.append(time.perf_counter() - t0)
            out.append(tok)
            for r in rows:
                logits[r].append(m.engine.read_rows(st.outputs["logits"], env, [r])[0])
    finally:
        give_many(m, leases)
    return Greedy(np.stack(out), {r: np.stack(v) for r, v in logits.items()}, prefill_s, step_s, st.program, env)
