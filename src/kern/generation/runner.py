"""Runs a step's rows through the protocol's programs: decode rows alone go through the
decode program (graph-captured on the GPU, padded up to a captured batch size), any other mix
through the ragged program, where a decode row is a one-token chunk."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..manifest.protocol import PROMPT_ALL, ServingProtocol, Stepper

if TYPE_CHECKING:
    from ..world.stepping import StepEngine


@dataclass(frozen=True, slots=True)
class Feed:
    """One sequence's rows this step."""

    tokens: list[int]
    start: int  # position of the first
    units: Units  # where the sequence's state lives
    temperature: float = 0.0  # the device draws the next token at this temperature (0: argmax)
    key: int = 0  # the 64-bit key of that draw
    mask: np.ndarray | None = None  # int32 [words]: the tokens that draw may take (a grammar's bitmask)
    prompt: int = PROMPT_ALL  # its request's prompt length: rows below it are prompt tokens (role prompt_len)


class Units:
    """A sequence's page table in each paged state and its slot in each per-sequence state:
    a lease's (read as the step fills its inputs), or the scratch row's."""

    __slots__ = ("tables", "slots")

    def __init__(self, tables, slots):
        self.tables = tables  # state -> pages in token order
        self.slots = slots  # state -> slot

    @classmethod
    def of(cls, lease) -> "Units":
        return cls(_TableOf(lease), _SlotOf(lease))


class _TableOf:
    __slots__ = ("lease",)

    def __init__(self, lease):
        self.lease = lease

    def __getitem__(self, state: str) -> list[int]:
        return self.lease.page_table(state)


class _SlotOf(_TableOf):
    __slots__ = ()

    def __getitem__(self, state: str) -> int:
        return self.lease.slot(state)


def buckets(limit: int, narrow: int | None = None) -> list[int]:
    """The decode batch sizes captured as graphs: 1, 2, 4, 8, then steps of 8 up to 64 (the
    batches a server runs most; a padded row costs a GEMM's share there) and steps of 16 past it
    (fewer graphs), and `limit` itself. `narrow` (the small-batch decode program's bound; None:
    `limit`) is always a size: the largest batch that program steps."""
    narrow = limit if narrow is None else min(narrow, limit)
    out = [1, 2, 4, 8]
    out += [b for b in range(16, min(limit, 64), 8)] + list(range(64, limit, 16))
    return sorted({b for b in out if b < limit} | {narrow, limit})


def ahead_buckets(sizes: list[int], fine: int = 32) -> list[int]:
    """The batch sizes whose run-ahead graphs are captured: every size up to `fine`, then the
    powers of two and the largest (a batch between runs ahead padded to the next: a padded
    row costs less than the host's part of the steps it saves, and every size's graph of
    several steps would double the start-up's captures)."""
    return [b for b in sizes if b <= fine or b & (b - 1) == 0 or b == sizes[-1]]


def bucket(n: int, sizes: list[int]) -> int:
    return next(b for b in sizes if b >= n)


class Runner:
    def __init__(self, engine: StepEngine, protocol: ServingProtocol, scratch, decode_max: int | None = None):
        """`scratch`: a lease of one page of each paged state and a slot of each per-sequence
        state that padding rows write, which no sequence reads."""
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
        self.ahead_sizes = ahead_buckets(self.sizes) if self.graphs else self.sizes
        self.mixed_groups = self.ragged.groups_max
        # decode rows alone: the decode programs up to their bound, the ragged one past it
        self.decode_groups = max(self.decode_max, self.mixed_groups)
        self.scratch = scratch
        self._page_tokens = max(protocol.paged_states.values())
        # the programs draw at a temperature on the device (roles temperature and rng), not only argmax
        self.samples = all({"temperature", "rng"} <= s.inputs.keys() for s in protocol.steppers)
        # ... and under a token mask (roles mask and mask_row): a grammar's rows draw there too
        self.masks = all({"mask", "mask_row"} <= s.inputs.keys() for s in protocol.steppers)
        # prompt and generated tokens take different forms (role prompt_len): decodes()
        self.roles = any("prompt_len" in s.inputs for s in protocol.every)

    def scratch_feed(self, position: int, steps: int = 1) -> Feed:
        """A row whose every page is the scratch page, for `steps` steps from `position`: it
        reads and writes nothing of anyone's. Its table holds the pages those steps reach and
        no more (a long context's full width would cost the host a list of thousands a row).
        Its rows are generated tokens (prompt_len = position): a warm-up row is a decode row,
        so it takes the decode program (its graphs) and never the ragged one, whose prompt rows
        would count position + 1 keys each against the keys var's bound."""
        pages = -(-(position + steps) // self._page_tokens)
        tables = {state: self.scratch.page_table(state)[:1] * pages for state in self.protocol.paged_states}
        return Feed([0], position, Units(tables, Units.of(self.scratch).slots), prompt=position)

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

    def decodes(self, f: Feed) -> bool:
        """Whether a feed is a decode row: one token, and where the programs read prompt_len
        (prompt and generated tokens take different forms), a generated one: a prompt token fed
        alone (a token budget of 1, say) still takes the ragged program, as in a longer chunk."""
        return len(f.tokens) == 1 and not (self.roles and f.start < f.prompt)

    def stepper_for(self, feeds: list[Feed]) -> Stepper:
        n = len(feeds)
        if all(self.decodes(f) for f in feeds) and n <= self.decode_max:
            n = bucket(n, self.sizes) if self.graphs else n
            return next(d for d in self.decoders if d.groups_max >= n)
        return self.ragged

    def run(self, feeds: list[Feed], logits: bool | list[int]) -> tuple[np.ndarray, np.ndarray | None]:
        """Each sequence's next token (its last row's argmax) and, when asked, its logits:
        `logits` True for every feed's, or the feeds whose logits the host reads (only their
        rows are copied off the device; the other rows of the array returned hold nothing).
        Where decode graphs exist, one-row feeds always take them (in slices of the decode
        bound) and only longer chunks take the ragged program: a step of many decode rows and
        a prefill chunk is then a few graph replays and one ragged run, not one ragged run of
        every row (which launches eagerly, far slower per row). The decode graphs go first and
        the host does not wait for them before the ragged run's launches (programs with inputs
        of their own): those launches' host time overlaps the graphs' device time."""
        single = [i for i, f in enumerate(feeds) if self.decodes(f)]
        if not self.graphs or not single or (len(single) == len(feeds) and len(feeds) <= self.decode_max):
            return self._launch(self.stepper_for(feeds), feeds, logits)()
        parts = [single[j:j + self.decode_max] for j in range(0, len(single), self.decode_max)]
        parts += [[i for i in range(len(feeds)) if not self.decodes(feeds[i])]]
        parts = [(idx, [feeds[i] for i in idx]) for idx in parts if idx]
        steppers = [self.stepper_for(sub) for _, sub in parts]
        got = []  # each part's read, made at once where a later run is of its program
        wanted = logits if isinstance(logits, bool) else set(logits)
        for j, (st, (idx, sub)) in enumerate(zip(steppers, parts)):
            apart = self._apart(st, steppers[j + 1:])
            want = wanted if isinstance(wanted, bool) else [k for k, i in enumerate(idx) if i in wanted]
            read = self._launch(st, sub, want, wait=not apart)
            got.append(read if apart else read())
        tokens = np.empty(len(feeds), np.int64)
        out = None
        for (idx, _), read in zip(parts, got):
            t, l = read() if callable(read) else read
            tokens[idx] = t[:len(idx)]
            if l is not None:
                out = np.empty((len(feeds), l.shape[1]), l.dtype) if out is None else out
                out[idx] = l[:len(idx)]
        return tokens, out

    @staticmethod
    def _apart(st: Stepper, later: list[Stepper]) -> bool:
        """Whether no later run writes an input st's launches have yet to read or an output of
        st's before it is read (another program, with buffers of its own); else the host waits
        for st's run and reads it before the next launch."""
        mine = _buffers(st)
        return all(o.program != st.program and not mine & _buffers(o) for o in later)

    def _inputs(self, st: Stepper, feeds: list[Feed]) -> dict[str, np.ndarray]:
        """The step's input arrays, by buffer."""
        n = len(feeds)
        inputs = {st.inputs["token"]: np.array([t for f in feeds for t in f.tokens], np.int32),
                  st.inputs["position"]: np.array([f.start + j for f in feeds for j in range(len(f.tokens))],
                                                  np.int32)}
        for pt in st.page_tables:
            table = np.zeros((n, self.engine.shapes[pt.buffer][1]), np.int32)
            for i, f in enumerate(feeds):
                pages = f.units.tables[pt.state]
                table[i, :len(pages)] = pages
            inputs[pt.buffer] = table
        for si in st.slots:
            inputs[si.buffer] = np.array([f.units.slots[si.state] for f in feeds], np.int32)
        if "seq_len" in st.inputs:  # positions each sequence holds after this step
            inputs[st.inputs["seq_len"]] = np.array([f.start + len(f.tokens) for f in feeds], np.int32)
        if "prompt_len" in st.inputs:
            inputs[st.inputs["prompt_len"]] = np.array([f.prompt for f in feeds], np.int32)
        if "cu_seqlens" in st.inputs:
            inputs[st.inputs["cu_seqlens"]] = np.cumsum([0] + [len(f.tokens) for f in feeds], dtype=np.int32)
        if "temperature" in st.inputs:
            inputs[st.inputs["temperature"]] = np.array([f.temperature for f in feeds], np.float32)
        if "rng" in st.inputs:  # each key as two i32, low word first
            inputs[st.inputs["rng"]] = _keys([f.key for f in feeds])
        if "mask_row" in st.inputs:  # written every step: a row not masked now reads 0 (every token)
            masked = [i for i, f in enumerate(feeds) if f.mask is not None]
            row = np.zeros(n, np.int32)
            row[masked] = np.arange(1, len(masked) + 1)
            inputs[st.inputs["mask_row"]] = row
            if masked:  # the masked rows' words alone, packed (the var's bucket of rows goes up)
                words = np.zeros((st.mask_bucket(len(masked)), self.engine.shapes[st.inputs["mask"]][1]), np.int32)
                words[:len(masked)] = [feeds[i].mask for i in masked]
                inputs[st.inputs["mask"]] = words
        return inputs

    def _pad(self, st: Stepper, feeds: list[Feed], steps: int = 1) -> list[Feed]:
        """Padded to a captured size (one graph per bucket) with rows on the scratch page."""
        if st is self.ragged or not self.graphs:
            return feeds
        sizes = self.sizes if steps == 1 else self.ahead_sizes
        return feeds + [self.scratch_feed(0, steps)] * (bucket(len(feeds), sizes) - len(feeds))

    def _launch(self, st: Stepper, feeds: list[Feed], logits: bool | list[int], wait: bool = True
                ) -> Callable[[], tuple[np.ndarray, np.ndarray | None]]:
        """Launch st's program on these feeds; the read of its tokens (and logits: every row's,
        or these rows' into an array of every row) to call."""
        feeds = self._pad(st, feeds)
        n = len(feeds)
        rows = sum(len(f.tokens) for f in feeds)
        reach = max(f.start + len(f.tokens) for f in feeds)
        masked = sum(f.mask is not None for f in feeds)
        env = self.engine.run(st.program, st.vars_for(n, rows, reach=reach, masked=masked), self._inputs(st, feeds),
                              wait=wait)

        def read() -> tuple[np.ndarray, np.ndarray | None]:
            tokens = self.engine.read(st.outputs["tokens"], env)
            if logits is True or logits is False or not logits:
                return tokens, self.engine.read(st.outputs["logits"], env) if logits else None
            some = self.engine.read_rows(st.outputs["logits"], env, logits)
            out = np.empty((n, some.shape[1]), some.dtype)
            out[logits] = some
            return tokens, out
        return read

    def verify(self, feeds: list[Feed], keys: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
        """A speculative round through the verify program, one host wait: each feed's rows are
        its last token and the tokens proposed after it, `keys[i]` the draw keys of feed i's
        rows (a row draws at its feed's temperature). Each row's token (the target's next token
        after that row) and each feed's accepted count (its proposal's matching prefix)."""
        st = self.protocol.verify
        inputs = self._inputs(st, feeds)
        inputs[st.inputs["temperature"]] = np.array([f.temperature for f in feeds for _ in f.tokens], np.float32)
        inputs[st.inputs["rng"]] = _keys([k for ks in keys for k in ks])
        rows = sum(len(f.tokens) for f in feeds)
        if "mask_row" in st.inputs:  # a round's rows are never masked (a grammar's row steps alone)
            inputs[st.inputs["mask_row"]] = np.zeros(rows, np.int32)
        env = self.engine.run(st.program, st.vars_for(len(feeds), rows), inputs)
        return self.engine.read(st.outputs["tokens"], env)[:rows], self.engine.read(st.outputs["accepted"], env)

    def run_ahead(self, feeds: list[Feed], k: int, keys: list[list[int]] | None = None,
                  each: Callable[[int, np.ndarray], None] | None = None) -> list[np.ndarray]:
        """k decode steps of these one-row feeds with one host wait, each step's token fed back
        on the device (the decode program that holds them, padded as a step is): each step's
        tokens, a row a feed. `keys[j - 1]`: step j's draw keys, a row a feed (where rows draw at
        a temperature). `each(j, tokens)`: step j's tokens as soon as they are on the host,
        while the later steps run."""
        n = len(feeds)
        top = bucket(n, self.ahead_sizes) if self.graphs else n
        st = next(d for d in self.decoders if d.groups_max >= top)
        padded = self._pad(st, feeds, k)
        inputs = self._inputs(st, padded)
        pos = inputs[st.inputs["position"]]
        later = []
        for j in range(1, k):
            step = {st.inputs["position"]: pos + j}
            if "seq_len" in st.inputs:
                step[st.inputs["seq_len"]] = inputs[st.inputs["seq_len"]] + j
            if "rng" in st.inputs:  # always among the varying inputs: one graph whether rows draw or not
                step[st.inputs["rng"]] = _keys((keys[j - 1] if keys else [0] * n) + [0] * (len(padded) - n))
            later.append(step)
        reach = max(f.start for f in padded) + k
        tok = st.outputs["tokens"]
        outs = self.engine.run_steps(st.program, st.vars_for(len(padded), len(padded), reach=reach), inputs, later,
                                     feedback={tok: st.inputs["token"]}, collect=[],
                                     each=None if each is None else lambda j, o: each(j, o[tok][:n]))
        return [o[tok][:n] for o in outs]


def _buffers(st: Stepper) -> set[str]:
    return {*st.inputs.values(), *st.outputs.values(), *(pt.buffer for pt in st.page_tables),
            *(si.buffer for si in st.slots)}


def _keys(keys: list[int]) -> np.ndarray:
    """64-bit draw keys as the rng input holds them: two i32 a row, low word first."""
    return np.array(keys, "<u8").view("<i4").reshape(len(keys), 2)
