"""How far the loop may go: context, sequences at once, tokens a step, run-ahead. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from ..manifest.protocol import ServingProtocol
from ..errors import BoundsError


# A lease is promised its prompt and this many tokens more; past that its pages come from the
# budget as it grows, and when the budget has none the youngest request is preempted. The
# worst case (prompt + max_tokens) would let one long max_tokens hold memory it rarely uses.
HEADROOM = 256
# Sequences at once follow the state budget: as many as it holds at SEQ_TOKENS tokens each (a
# typical chat turn), up to the programs' bound. More would only capture graphs for batches the
# pool never admits.
SEQ_TOKENS = 512


@dataclass(frozen=True, slots=True)
class Limits:
    context: int  # positions a sequence may reach
    max_seqs: int  # sequences running at once
    budget: int  # tokens fed a step (decode rows + prefill chunks)
    run_ahead: int  # greedy decode steps a host wait when one sequence runs alone
    headroom: int | None = HEADROOM  # tokens promised past the prompt at admission (None: all of max_tokens)
    note: str | None = None  # why the context is less than asked, for the user
    keys: int | None = None  # prompt keys a step's rows may attend over (the ragged program's Batch.keys; None: no bound)


def held_tokens(fits, page_tokens: int, hi: int) -> int:
    """The most tokens (a multiple of the page, at most `hi`) one sequence's lease may hold:
    `fits(tokens)` is monotonic, so bisect."""
    lo, hi = 0, hi // page_tokens
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid * page_tokens):
            lo = mid
        else:
            hi = mid - 1
    return lo * page_tokens


def limits_for(protocol: ServingProtocol, fits, page_tokens: int, context: int | None, max_seqs: int | None,
               run_ahead: int, scratch_tokens: int = 0, capacity: int | None = None) -> Limits:
    """`fits(tokens)`: whether the pool holds a lease that large when empty; `scratch_tokens`
    are held for good by the loop (padding rows' page); `capacity`: tokens the whole budget
    holds (None: no bound on sequences from it)."""
    bound = protocol.max_positions or 1 << 20
    ragged = protocol.for_rows(1, None)
    seqs_max = max([ragged.groups_max] + [d.groups_max for d in protocol.fixed(1)])
    if max_seqs is not None and max_seqs > seqs_max:
        raise BoundsError(f"max_seqs {max_seqs} is above the manifest's bound of {seqs_max} sequences a step")
    if context is not None and context < 2:
        raise BoundsError(f"context must be at least 2 positions (a prompt token and a generated one), got {context}")
    keys = ragged.keys_max if ragged.keys_var else None
    if keys is not None:
        bound = min(bound, keys - keys % page_tokens)  # a prompt of the whole context fits one step's keys
    want = min(context or bound, bound)
    held = held_tokens(lambda n: fits(n + scratch_tokens), page_tokens, want)
    note = None
    if context is not None and context > bound:
        note = f"context {context} is above the deployment's bound: {bound} positions"
    if held < want:
        if held < 2:
            raise BoundsError("the state budget holds no sequence: raise --memory")
        note = (f"context clipped to {held} positions: the state budget holds that many tokens of one "
                f"sequence (raise --memory for the {want} asked)")
        want = held
    if max_seqs is None:
        max_seqs = seqs_max if capacity is None else max(1, min(seqs_max, capacity // SEQ_TOKENS))
    return Limits(want, max_seqs, ragged.rows_max, run_ahead, note=note, keys=keys)
