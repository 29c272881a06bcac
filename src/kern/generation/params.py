"""What a request asks of generation: the sampling knobs, checked once at the door."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import BoundsError


# Temperatures below this act as greedy (docs/serve.md): the device divides in float32, where 1/T
# of a subnormal T (1e-40) is inf; at 1e-6 only tokens within ~2e-5 nats of the best could still
# be drawn, below a float32 logit's own resolution.
GREEDY_BELOW = 1e-6

# Tokens generated at most when a caller of the API or kern run says nothing (the server's
# defaults are OpenAI's: docs/serve.md).
DEFAULT_MAX_TOKENS = 64


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float = 0.0  # 0 or below GREEDY_BELOW: greedy (the device's argmax; no logits unless logprobs)
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int | None = None  # per request: the same seed reproduces the output; never global state
    stop: tuple[str, ...] = ()  # stop strings: generation ends at the first; the text excludes it
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # None: none; k >= 0: the chosen token's logprob plus the top k
    # (token id, bias) pairs added to the logits before penalties and the draw (OpenAI's logit_bias)
    logit_bias: tuple[tuple[int, float], ...] = ()
    # an llguidance grammar (generation/constraints.py): every token drawn is one it allows
    grammar: str | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW or self.top_k == 1

    @property
    def device_temperature(self) -> float:
        """The temperature the device draws this row at: 0 (its argmax) where greedy."""
        return 0.0 if self.greedy else self.temperature

    @property
    def penalized(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0
                or self.presence_penalty != 0.0)

    @property
    def shaped(self) -> bool:
        """Whether the logits are changed before the draw (a bias or a grammar's mask): the
        host draws such a row, also a greedy one."""
        return bool(self.logit_bias) or self.grammar is not None

    @property
    def device_samples(self) -> bool:
        """Whether a device that draws at a temperature (kern's sample op) can make this row's
        token from the logits alone: greedy, or plain temperature sampling (no truncation, no
        penalty, no logprobs)."""
        return self.device_masks and self.grammar is None

    @property
    def device_masks(self) -> bool:
        """Whether a device that draws under a token mask (the sample op's mask inputs) can make
        this row's token: as device_samples, a grammar allowed (its mask goes up with the step)."""
        plain = self.top_p >= 1.0 and self.top_k == 0 and self.min_p == 0.0
        return self.logprobs is None and not self.penalized and not self.logit_bias and (self.greedy or plain)

    @property
    def needs_logits(self) -> bool:
        """Whether the host must read this row's logits (the device's argmax token suffices otherwise)."""
        return not self.greedy or self.penalized or self.shaped or self.logprobs is not None

    def check(self) -> None:
        """Raise BoundsError naming the first field outside its domain."""
        for name, ok, domain in _RULES:
            value = getattr(self, name)
            if not ok(value):
                raise BoundsError(f"{name} must be {domain}, got {value!r}")


class ContextError(BoundsError):
    """A request that does not fit the context; `field`: "prompt" (it leaves no room) or
    "max_tokens" (past the room it leaves)."""

    def __init__(self, message: str, field: str):
        super().__init__(message)
        self.field = field


def context_room(prompt: int, context: int, max_tokens: int | None = None, where: str = "") -> int:
    """The tokens a prompt of `prompt` tokens leaves for generation in a context of `context`
    positions, checked: the one refusal (kern serve's 400, Loop.add, MegaModel) of a prompt that
    leaves none or of a max_tokens past what it leaves (refused, never clipped). `where`
    prefixes the message (whose request)."""
    room = context - prompt
    if room < 1:
        raise ContextError(f"{where}the prompt is {prompt} tokens; this model's context is {context} positions, "
                           f"so a prompt may hold at most {context - 1}", "prompt")
    if max_tokens is not None and max_tokens > room:
        raise ContextError(f"{where}max_tokens is {max_tokens}, but the prompt's {prompt} tokens leave room for at most "
                           f"{room} in this model's context of {context} positions", "max_tokens")
    return room


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _num(v) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


def _strs(v) -> bool:
    return isinstance(v, tuple) and all(isinstance(s, str) and s for s in v)


def _bias(v) -> bool:
    return isinstance(v, tuple) and all(isinstance(p, tuple) and len(p) == 2 and _int(p[0]) and p[0] >= 0
                                        and _num(p[1]) and -100 <= p[1] <= 100 for p in v)


def _ids(v) -> bool:
    return isinstance(v, tuple) and all(_int(t) and t >= 0 for t in v)


_RULES = (
    ("max_tokens", lambda v: _int(v) and v >= 1, "an integer >= 1"),
    ("temperature", lambda v: _num(v) and v >= 0, "a finite number >= 0"),
    ("top_p", lambda v: _num(v) and 0 < v <= 1, "in (0, 1]"),
    ("top_k", lambda v: _int(v) and v >= 0, "an integer >= 0 (0 = off)"),
    ("min_p", lambda v: _num(v) and 0 <= v <= 1, "in [0, 1]"),
    ("repetition_penalty", lambda v: _num(v) and v > 0, "a finite number > 0"),
    ("frequency_penalty", lambda v: _num(v) and -2 <= v <= 2, "in [-2, 2]"),
    ("presence_penalty", lambda v: _num(v) and -2 <= v <= 2, "in [-2, 2]"),
    ("seed", lambda v: v is None or (_int(v) and v >= 0), "None or an integer >= 0"),
    ("stop", _strs, "a tuple of non-empty strings"),
    ("stop_token_ids", _ids, "a tuple of token ids >= 0"),
    ("ignore_eos", lambda v: isinstance(v, bool), "a bool"),
    ("logprobs", lambda v: v is None or (_int(v) and 0 <= v <= 20), "None or an integer in [0, 20]"),
    ("logit_bias", _bias, "a tuple of (token id >= 0, bias in [-100, 100]) pairs"),
    ("grammar", lambda v: v is None or (isinstance(v, str) and bool(v)), "None or a non-empty grammar"),
)
