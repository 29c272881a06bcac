"""Runs a step's rows through the protocol's programs: decode rows alone go through the
decode program (graph-captured on the GPU, padded up to a captured batch size), any other mix
through the ragged program, where a decode row is a one-token chunk."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..manifest.protocol import Protocol, Stepper

if TYPE_CHECKING:
    from ..runtime.stepping import StepEngine


@dataclass(frozen=True, slots=True)
class Feed:
    """One sequence's rows this step."""

    tokens: list[int]
    start: int  # position of the first
    pages: list[int]  # the sequence's page table
    temperature: float = 0.0  # the device draws the next token at this temperature (0: argmax)
    key: int = 0  # the 64-bit key of that draw


def buckets(limit: int, narrow: int | None = None) -> list[int]:
    """The decode batch sizes captured as graphs: 1, 2, 4, 8, then steps of 8 up to `narrow`
    (the small-batch decode program's bound; None: `limit`), steps of 16 past it (a wide
    program's graphs: larger, so fewer of them), and `limit` itself."""
    narrow = limit if narrow is None else min(narrow, limit)
    out = [b for b in (1, 2, 4, 8) if b < narrow]
    out += list(range(16, narrow, 8))
    out += list(range(narrow, limit, 16)) if narrow < limit else []
    return out + [limit]


def bucket(n: int, sizes: list[int]) -> int:
    return next(b for b in sizes if b >= n)


class Runner:
    def __init__(self, engine: StepEngine, protocol: Protocol, scratch_page: int, decode_max: int | None = None):
        self.engine = engine
        self.protocol = protocol
        # one-row-a-sequence programs, fewest sequences first: decode, and a wide decode where
        # the manifest has one (the step takes the smallest that holds its batch)
        self.decoders = protocol.fixed(1)
        self.decode = self.decoders[0]
        self.ragged = protocol.for_rows(1, None)
        self.graphs = engine.runs_steps_natively(self.decode.program)
        top = self.decoders[-1].groups_max
        self.decode_max = min(decode_max or top, top)
        self.sizes = buckets(self.decode_max, self.decode.groups_max)
        self.mixed_groups = self.ragged.groups_max
        # decode rows alone: the decode programs up to their bound, the ragged one past it
        self.decode_groups = max(self.decode_max, self.mixed_groups)
        self.scratch = scratch_page  # padding rows write here, a page no sequence reads
        self._scratch_width = min(engine.shapes[d.page_tables[0].buffer][1] for d in self.decoders)
        # the programs draw at a temperature on the device (roles temperature and rng), not only argmax
        self.samples = all({"temperature", "rng"} <= s.inputs.keys() for s in protocol.steppers)

    def scratch_feed(self, position: int) -> Feed:
        """A row whose every page is the scratch page: it reads and writes nothing of anyone's."""
        return Feed([0], position, [self.scratch] * self._scratch_width)

    def reach_buckets(self, reach: int) -> list[int]:
        """The decode program's reach buckets up to the one holding `reach` positions."""
        st = self.decode
        if st.reach_var is None:
            return [reach]
        top = st.reach_bucket(min(reach, st.reach_max))
        out, r = [], st.reach_bucket(1)
        while r < top:
            out.append(r)
            r = st.reach_bucket(r + 1)
        return out + [top]

    def stepper_for(self, feeds: list[Feed]) -> Stepper:
        n = len(feeds)
        if all(len(f.tokens) == 1 for f in feeds) and n <= self.decode_max:
            n = bucket(n, self.sizes) if self.graphs else n
            return next(d for d in self.decoders if d.groups_max >= n)
        return self.ragged

    def run(self, feeds: list[Feed], logits: bool) -> tuple[np.ndarray, np.ndarray | None]:
        """Each sequence's next token (its last row's argmax) and, when asked, its logits.
        Where decode graphs exist, one-row feeds always take them (in slices of the decode
        bound) and only longer chunks take the ragged program: a step of many decode rows and
        a prefill chunk is then a few graph replays and one ragged run, not one ragged run of
        every row (which launches eagerly, far slower per row)."""
        single = [i for i, f in enumerate(feeds) if len(f.tokens) == 1]
        if not self.graphs or not single or (len(single) == len(feeds) and len(feeds) <= self.decode_max):
            return self._run(self.stepper_for(feeds), feeds, logits)
        parts = [[i for i in range(len(feeds)) if len(feeds[i].tokens) > 1]]
        parts += [single[j:j + self.decode_max] for j in range(0, len(single), self.decode_max)]
        tokens = np.empty(len(feeds), np.int64)
        out = None
        for idx in filter(None, parts):
            sub = [feeds[i] for i in idx]
            t, l = self._run(self.stepper_for(sub), sub, logits)
            tokens[idx] = t[:len(idx)]
            if l is not None:
                out = np.empty((len(feeds), l.shape[1]), l.dtype) if out is None else out
                out[idx] = l[:len(idx)]
        return tokens, out

    def _run(self, st: Stepper, feeds: list[Feed], logits: bool) -> tuple[np.ndarray, np.ndarray | None]:
        if st is not self.ragged and self.graphs:  # pad to a captured size: one graph per bucket
            pad = bucket(len(feeds), self.sizes) - len(feeds)
            feeds = feeds + [self.scratch_feed(0)] * pad
        n = len(feeds)
        rows = sum(len(f.tokens) for f in feeds)
        inputs = {st.inputs["token"]: np.array([t for f in feeds for t in f.tokens], np.int32),
                  st.inputs["position"]: np.array([f.start + j for f in feeds for j in range(len(f.tokens))],
                                                  np.int32)}
        for pt in st.page_tables:
            table = np.zeros((n, self.engine.shapes[pt.buffer][1]), np.int32)
            for i, f in enumerate(feeds):
                table[i, :len(f.pages)] = f.pages
            inputs[pt.buffer] = table
        if "cu_seqlens" in st.inputs:
            inputs[st.inputs["cu_seqlens"]] = np.cumsum([0] + [len(f.tokens) for f in feeds], dtype=np.int32)
        if "temperature" in st.inputs:
            inputs[st.inputs["temperature"]] = np.array([f.temperature for f in feeds], np.float32)
        if "rng" in st.inputs:  # each key as two i32, low word first
            inputs[st.inputs["rng"]] = np.array([f.key for f in feeds], "<u8").view("<i4").reshape(n, 2)
        reach = max(f.start + len(f.tokens) for f in feeds)
        env = self.engine.run(st.program, st.vars_for(n, rows, reach=reach), inputs)
        tokens = self.engine.read(st.outputs["tokens"], env)
        out = self.engine.read(st.outputs["logits"], env) if logits else None
        return tokens, out

    def run_ahead(self, feed: Feed, k: int) -> list[int]:
        """k greedy decode steps of one sequence, one host wait (the token fed back on the
        device): the k tokens."""
        st = self.decode
        (tok,), pos = feed.tokens, feed.start
        inputs = {st.inputs["token"]: np.array([tok], np.int32), st.inputs["position"]: np.array([pos], np.int32)}
        for pt in st.page_tables:
            table = np.zeros((1, self.engine.shapes[pt.buffer][1]), np.int32)
            table[0, :len(feed.pages)] = feed.pages
            inputs[pt.buffer] = table
        if "cu_seqlens" in st.inputs:
            inputs[st.inputs["cu_seqlens"]] = np.array([0, 1], np.int32)
        for role, a in (("temperature", np.zeros(1, np.float32)), ("rng", np.zeros((1, 2), np.int32))):
            if role in st.inputs:  # greedy: the argmax fed back on the device
                inputs[st.inputs[role]] = a
        outs = self.engine.run_steps(st.program, st.vars_for(1, 1, reach=pos + k), inputs,
                                     [{st.inputs["position"]: np.array([pos + j], np.int32)} for j in range(1, k)],
                                     feedback={st.outputs["tokens"]: st.inputs["token"]}, collect=[])
        return [int(o[st.outputs["tokens"]][0]) for o in outs]
