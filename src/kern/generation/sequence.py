"""A request inside the loop: its tokens so far, its lease, and how it ends."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..pool import Lease
from .detok import TextStream
from .params import SamplingParams


GENERATED = 1 << 30  # a generated token's pool key where roles differ: its id with this bit (ids are below it)


@dataclass(eq=False)
class SequenceState:
    id: str
    prompt: list[int]
    params: SamplingParams  # Loop.add refused it unless prompt + max_tokens fit the context
    text: TextStream
    seed: int  # the request's seed (its own or one derived from its id): keys every draw (keys.draw_key)
    out: list[int] = field(default_factory=list)
    lease: Lease | None = None
    written: int = 0  # tokens of prompt + out whose state the device holds (the lease's tokens)
    cached: int = 0  # prompt tokens served from the prefix cache at first admission
    admitted: bool = False
    snapshots: list[int] = field(default_factory=list)  # prefill chunks end at these lengths, checkpointed there
    finish: str | None = None
    constraint: object | None = None  # its grammar's matcher (llguidance.LLMatcher), fed every token drawn
    roles: bool = False  # the deployment computes prompt and generated tokens in different forms (role prompt_len)

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.out

    def span(self, start: int, n: int) -> list[int]:
        """tokens[start:start + n] without building tokens (a step reads one row of each)."""
        p = len(self.prompt)
        if start >= p:
            return self.out[start - p:start - p + n]
        return self.prompt[start:start + n] + self.out[:max(0, start + n - p)]

    def keys(self, start: int, n: int) -> list[int]:
        """tokens[start:start + n] as the pool keys them. Where the deployment computes a prompt
        token and a generated one in different forms (`roles`), a generated token's key carries
        GENERATED: a cached token then serves only a token of its own role (the next turn of a
        chat recomputes the last reply as prompt tokens, as a cold server would), and a resumed
        request still finds its own generated tokens."""
        span = self.span(start, n)
        if not self.roles:
            return span
        p = len(self.prompt)
        return [t | GENERATED if start + i >= p else t for i, t in enumerate(span)]

    def key(self, token: int) -> int:
        """A generated token's pool key (keys())."""
        return token | GENERATED if self.roles else token

    @property
    def left(self) -> int:
        """Tokens it may still generate: its max_tokens less those out."""
        return self.params.max_tokens - len(self.out)

    @property
    def reach(self) -> int:
        """Positions it may hold at most: its prompt and max_tokens."""
        return len(self.prompt) + self.params.max_tokens

    @property
    def pending(self) -> int:
        """Tokens to feed before the next token comes out (1 when decoding)."""
        return len(self.prompt) + len(self.out) - self.written
