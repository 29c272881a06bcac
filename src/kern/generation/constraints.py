"""Constrained decoding: a request's grammar (a JSON schema, or a Lark grammar of llguidance's
dialect) turned into a token mask per step, batched over the step's constrained rows.

llguidance (docs/serve.md says why it over xgrammar) keeps one matcher per sequence: its
state after the tokens so far. Each step the loop asks for the masks of every constrained row
at once (one call, computed in parallel by llguidance's own threads), applies them to those
rows' logits before the draw, and hands each matcher the token drawn. Rows without a grammar
never reach this module: they pay nothing.

The mask is a bitmask, 32 tokens an int32 word (llguidance's layout, the same a device kernel
would read); on the host it becomes a boolean row of the logits' width."""

from __future__ import annotations

import json
from functools import lru_cache

import numpy as np

from ..errors import BoundsError

# How a JSON schema's document is spelled: one space after ':' and ',' and no free whitespace
# between tokens (a small model given free whitespace can spend its budget on newlines), the
# layout models see most in their training text.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def _llg():
    import llguidance

    return llguidance


def json_schema_grammar(schema: dict | bool) -> str:
    """The llguidance grammar for documents valid under `schema` (Draft 2020-12 and older,
    as llguidance implements them; a keyword it does not implement is an error, never ignored)."""
    return _llg().LLMatcher.grammar_from_json_schema(json.dumps(schema), overrides=JSON_OPTIONS)


def lark_grammar(text: str) -> str:
    return _llg().LLMatcher.grammar_from_lark(text)


def grammar_problem(grammar: str) -> str | None:
    """What is wrong with a grammar, in llguidance's words (None: it compiles). Checked without
    a tokenizer: the API process refuses a bad schema before the request reaches the loop."""
    msg = _llg().LLMatcher.validate_grammar(grammar)
    if not msg or msg.startswith("WARNING"):
        return None
    return msg


def _vocabulary(llg, tokenizer_json: str, width: int, eos: list[int]):
    """llguidance's view of the vocabulary, every end-of-sequence token ending a grammar where
    this llguidance takes a list of them; an older one (1.6, which vLLM 0.26 pins, and kern
    runs in vLLM's process) takes one token, the lowest: the others still end a sequence in the
    loop, but a grammar cannot end on them."""
    try:
        return llg.LLTokenizer(tokenizer_json, n_vocab=width, eos_token=eos)
    except TypeError:
        return llg.LLTokenizer(tokenizer_json, n_vocab=width, eos_token=eos[0] if eos else None)


class Grammars:
    """The tokenizer-side of constrained decoding for one loop: llguidance's view of the
    vocabulary (built once, on the first constrained request: ~0.6 s for a 49k vocabulary)
    and a thread pool that computes a step's masks together."""

    def __init__(self, tokenizer, width: int, eos: set[int]):
        """`tokenizer`: kern.tokenizer.Tokenizer; `width`: the logits' row width (the model's
        vocabulary, which may exceed the tokenizer's); `eos`: the tokens that end a sequence."""
        self.tokenizer, self.width, self.eos = tokenizer, width, sorted(eos)
        self._lt = None
        self._exec = None
        self._problem: str | None = None  # why the vocabulary's side cannot be built, once known

    @property
    def words(self) -> int:
        return (self.width + 31) // 32

    def _tok(self):
        if self._lt is None:
            if self._problem is None and self.tokenizer is None:
                self._problem = "a grammar needs the checkpoint's tokenizer.json, which this one lacks"
            if self._problem is not None:
                raise BoundsError(self._problem)
            llg = _llg()
            try:
                self._lt = _vocabulary(llg, self.tokenizer.tok.to_str(), self.width, self.eos)
            except (ValueError, RuntimeError) as e:  # one llguidance cannot read (no byte-level decoder, say)
                self._problem = f"structured output cannot read this checkpoint's tokenizer: {e}"
                raise BoundsError(self._problem) from None
            self._exec = llg.LLExecutor()
        return self._lt

    def prepare(self) -> str | None:
        """Build the vocabulary's side now (a server does at start-up: ~0.6 s for 49k tokens).
        Returns why it cannot be built (then every grammar request is refused with that), or None."""
        try:
            self._tok()
        except BoundsError as e:
            return str(e)
        return None

    def matcher(self, grammar: str):
        """A fresh matcher at the grammar's start; BoundsError naming the problem otherwise."""
        m = _llg().LLMatcher(self._tok(), grammar, log_level=0)
        if m.is_error():
            raise BoundsError(f"the grammar is not usable: {m.get_error()}")
        return m

    def bitmasks(self, matchers: list) -> np.ndarray:
        """int32 [len(matchers), words]: bit t % 32 of word t // 32 set where token t may come next."""
        out = np.zeros((len(matchers), self.words), np.int32)
        self._tok()
        self._exec.unsafe_compute_mask_ptr([(m, i) for i, m in enumerate(matchers)], out.ctypes.data,
                                           self.words * 4, len(matchers))
        return out

    def allowed(self, matchers: list) -> np.ndarray:
        """bool [len(matchers), width]: the tokens each matcher allows next."""
        return unpack(self.bitmasks(matchers), self.width)


def unpack(bitmask: np.ndarray, width: int) -> np.ndarray:
    """A [rows, words] int32 bitmask as bool [rows, width] (word w bit b is token 32 w + b)."""
    bits = np.unpackbits(np.ascontiguousarray(bitmask, "<i4").view(np.uint8), axis=1, bitorder="little")
    return bits[:, :width].astype(bool)


@lru_cache(maxsize=256)
def cached_problem(grammar: str) -> str | None:
    """grammar_problem, remembered: a client that sends the same schema with every request
    pays for its check once."""
    return grammar_problem(grammar)
