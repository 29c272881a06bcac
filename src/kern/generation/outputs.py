"""What the loop hands back: per step, one Delta per request that changed."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]  # the k most likely (token, logprob), best first


@dataclass(frozen=True, slots=True)
class Delta:
    """What one step produced for one request."""

    request_id: str
    token_ids: tuple[int, ...]  # tokens new this step (may be empty, e.g. a prefill chunk)
    text: str  # text new this step: never half a UTF-8 character, stop strings withheld
    logprobs: tuple[TokenLogprob, ...]  # one per new token when asked, else ()
    finish_reason: str | None  # None while running; "stop" | "length" | "abort"
    prompt_tokens: int
    cached_tokens: int  # prompt tokens served from the prefix cache
    completion_tokens: int  # generated so far


@dataclass(frozen=True, slots=True)
class LoopStats:
    waiting: int
    running: int
    steps: int
    prompt_tokens: int
    cached_tokens: int
    pool_pages_used: int
    pool_pages_total: int
    # every paged and per-sequence state: (state, "page" or "slot", units held, units mapped,
    # chunks mapped, units held only by cached prefixes); they draw on one budget of `pool_chunks`
    # chunks, `pool_chunks_free` unmapped
    pool_states: tuple[tuple[str, str, int, int, int, int], ...] = ()
    pool_chunks: int = 0
    pool_chunks_free: int = 0
    # tokens so far of idle conversations' checkpoints parked in host memory, and of leases
    # woken from such a copy (their prefix not recomputed)
    parked_tokens: int = 0
    woken_tokens: int = 0
    # speculative rounds so far (speculative.SpecStats): sequences' rounds, tokens proposed, kept,
    # and made by the rounds; all 0 where the loop does not speculate
    spec_rounds: int = 0
    spec_proposed: int = 0
    spec_accepted: int = 0
    spec_tokens: int = 0
