"""A request inside the loop: its tokens so far, its lease, and how it ends."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..pool import Lease
from .detok import TextStream
from .params import SamplingParams


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

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.out

    def span(self, start: int, n: int) -> list[int]:
        """tokens[start:start + n] without building tokens (a step reads one row of each)."""
        p = len(self.prompt)
        if start >= p:
            return self.out[start - p:start - p + n]
        return self.prompt[start:start + n] + self.out[:max(0, start + n - p)]

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
