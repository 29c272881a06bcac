"""A host's batch mapped onto the serving protocol: which programs run, on which of the host's
rows and sequences, with which vars (pure; no device, no torch).

A host (vLLM) hands over one step as rows in sequence order: each sequence's query rows are
contiguous (`query_start_loc`), its pages are a row of the host's block table and every row has
its own position. kern's programs step such a batch as one or more calls: a batch of one row a
sequence goes to the fixed-rows programs (decode) where one fits, anything else to the ragged
program; a batch wider than a program's var bounds is cut into several calls, in order, a
sequence's rows split between two calls where they do not fit (a chunked prefill: the later
call reads the pages the earlier one wrote). Each call writes its sequences' logits in order;
a sequence split over two calls gets its logits from the later one, which holds its last row.

`sources` names, for one call, the slices of the host's arrays that fill each role: the same
code slices numpy arrays (the CPU tests) and torch tensors (the vLLM plugin)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import KernError
from ..manifest.protocol import ServingProtocol, Stepper

ROLES_READ = ("token", "position", "cu_seqlens", "seq_len")  # input roles a host fills
ROLES_LEFT = ("temperature", "rng", "mask", "mask_row")  # sampling inputs: the host samples; left at zero (greedy, no mask)


class HostError(KernError, ValueError):
    """A host's configuration, memory or batch that kern cannot serve; one line, both sides named."""


@dataclass(frozen=True, slots=True)
class Piece:
    seq: int  # the sequence's index in the host's batch
    row0: int  # its first row in this call, as a row of the host's batch
    rows: int
    tail: int  # the sequence's rows after this piece (in later calls): 0 for its last piece


@dataclass(frozen=True, slots=True)
class Call:
    stepper: Stepper
    pieces: tuple[Piece, ...]
    vars: dict[str, int]

    @property
    def groups(self) -> int:
        return len(self.pieces)

    @property
    def rows(self) -> tuple[int, int]:
        """[first, end) rows of the host's batch this call steps."""
        return self.pieces[0].row0, self.pieces[-1].row0 + self.pieces[-1].rows

    @property
    def seqs(self) -> tuple[int, int]:
        """[first, end) sequences of the host's batch this call steps (logits rows, in order)."""
        return self.pieces[0].seq, self.pieces[-1].seq + 1

    @property
    def uniform(self) -> bool:
        """Every sequence one row and none split: cu_seqlens is 0, 1, ..., groups."""
        return all(p.rows == 1 and p.tail == 0 for p in self.pieces)

    def cu_seqlens(self) -> np.ndarray:
        return np.cumsum([0] + [p.rows for p in self.pieces], dtype=np.int32)

    def tails(self) -> np.ndarray:
        return np.array([p.tail for p in self.pieces], np.int32)


def check_protocol(p: ServingProtocol) -> None:
    """What a host needs of a deployment's programs: a ragged program, logits out of every
    program, and only the roles a host can fill (no per-sequence state slots)."""
    if not any(s.ragged for s in p.steppers):
        raise HostError("the deployment has no ragged program (rows a var): a host's prefill and mixed steps need one")
    for s in p.steppers:
        if "logits" not in s.outputs:
            raise HostError(f"program {s.program!r} has no `logits` output: the host samples from logits")
        if s.slots:
            raise HostError(f"program {s.program!r} reads per-sequence state slots ({s.slots[0].state!r}): a host "
                            "plugin serves paged states only")
        for role in ("token", "position", "cu_seqlens"):
            if role not in s.inputs:
                raise HostError(f"program {s.program!r} has no `{role}` input")
        unknown = sorted(set(s.inputs) - set(ROLES_READ) - set(ROLES_LEFT))
        if unknown:
            raise HostError(f"program {s.program!r} reads roles a host does not fill: {', '.join(unknown)}")


def _decode_cap(p: ServingProtocol) -> int:
    fixed = [s.groups_max for s in p.fixed(1)]
    ragged = [min(s.groups_max, s.rows_max) for s in p.steppers if s.ragged]
    return max(fixed + ragged)


def plan(p: ServingProtocol, query_lens: Sequence[int], reach: int) -> list[Call]:
    """The calls that step a host batch of len(query_lens) sequences with query_lens[s] rows
    each, whose rows reach `reach` positions (the largest sequence length): for the reach var
    of the programs that have one. Sequences of no rows (a host's padding) are left out."""
    lens = [int(n) for n in query_lens]
    if any(n < 0 for n in lens):
        raise HostError(f"a host batch has a negative query length: {lens}")
    starts = np.concatenate([[0], np.cumsum(lens)]).astype(int).tolist()
    live = [s for s, n in enumerate(lens) if n > 0]
    if not live:
        return []
    calls: list[Call] = []
    if all(lens[s] == 1 for s in live) and live == list(range(live[0], live[-1] + 1)):
        cap = _decode_cap(p)
        for i in range(0, len(live), cap):
            chunk = live[i:i + cap]
            st = p.for_rows(len(chunk), 1)
            calls.append(_call(st, tuple(Piece(s, starts[s], 1, 0) for s in chunk), reach))
        return calls
    st = next(s for s in p.steppers if s.ragged)
    pieces: list[Piece] = []
    room = st.rows_max
    for s in live:
        at, left = starts[s], lens[s]
        while left:
            if len(pieces) == st.groups_max or room == 0:
                calls.append(_call(st, tuple(pieces), reach))
                pieces, room = [], st.rows_max
            take = min(left, room)
            left -= take
            pieces.append(Piece(s, at, take, left))
            at += take
            room -= take
    calls.append(_call(st, tuple(pieces), reach))
    return calls


def _call(st: Stepper, pieces: tuple[Piece, ...], reach: int) -> Call:
    rows = sum(p.rows for p in pieces)
    groups = len(pieces)
    if not st.ragged:  # a fixed-rows program steps groups x rows
        rows = groups * st.rows
    try:
        vars = st.vars_for(groups, rows, reach if st.reach_var else None)
    except KernError as exc:
        raise HostError(f"the host's batch does not fit the deployment: {exc}") from None
    return Call(st, pieces, vars)


@dataclass(frozen=True)
class HostBatch:
    """One step as the host holds it (numpy arrays or torch tensors alike): input_ids and
    positions a row, block_table [sequences, pages] and seq_lens a sequence."""

    input_ids: Any
    positions: Any
    block_table: Any
    seq_lens: Any


def sources(call: Call, b: HostBatch, page_width: int) -> dict[str, Any]:
    """Role (and page table buffer) -> the slice of the host's arrays that fills it for this
    call; cu_seqlens and a split sequence's seq_len come from the plan (Call.cu_seqlens, tails),
    not from the host. page_width: the columns of the deployment's page tables; a host's
    block table narrower than that fills the first columns."""
    r0, r1 = call.rows
    s0, s1 = call.seqs
    out = {"token": b.input_ids[r0:r1], "position": b.positions[r0:r1]}
    for pt in call.stepper.page_tables:
        out[pt.buffer] = b.block_table[s0:s1, :page_width]
    if "seq_len" in call.stepper.inputs:
        out["seq_len"] = b.seq_lens[s0:s1]  # less each piece's tail (Call.tails) where a sequence is split
    return out
