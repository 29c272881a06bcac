"""The scheduler: which waiting requests to try to admit, and which rows each running
sequence gets this step. Pure functions over small views, tested without a device."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Running:
    id: str
    pending: int  # tokens to feed before its next token (1: a decode row)


@dataclass(frozen=True, slots=True)
class Row:
    id: str
    tokens: int  # fed this step; a decode row is 1


def admissions(waiting: int, running: int, max_seqs: int) -> int:
    """How many waiting requests to try to admit, in arrival order: up to max_seqs running.
    The loop asks the pool for each in turn and stops at the first it refuses (no overtaking:
    a large request at the head is not starved by small ones behind it)."""
    return max(0, min(waiting, max_seqs - running))


def schedule(running: Sequence[Running], budget: int, chunk_max: int, decode_groups: int,
             mixed_groups: int) -> list[Row]:
    """This step's rows: every decoding sequence's one token first (decode latency does not wait
    on prefill), then prefill chunks in admission order while the token budget lasts. At most
    `decode_groups` sequences in a step of decode rows only, `mixed_groups` in a step with
    prefill chunks; chunks at most `chunk_max` tokens."""
    rows: list[Row] = []
    left = budget
    for r in running:
        if r.pending == 1 and left > 0 and len(rows) < decode_groups:
            rows.append(Row(r.id, 1))
            left -= 1
    for r in running:
        if r.pending > 1 and left > 0 and len(rows) < mixed_groups:
            n = min(r.pending, left, chunk_max)
            rows.append(Row(r.id, n))
            left -= n
    return rows


def victim(running: Sequence[Running]) -> str:
    """The request to preempt when the budget cannot grow the running ones: the youngest
    (admitted last), whose checkpoint is smallest and whose wait is fairest."""
    return running[-1].id
