"""Text out, token by token: never half a UTF-8 character, never moving back, stop strings
withheld until they are ruled out."""

from __future__ import annotations


# The prompt's last tokens a request's stream decodes (and drops) before its first generated one:
# the text then continues the prompt's, so a tokenizer that spaces words by context (a word-level
# one, SentencePiece's leading "▁") gives the first word its space, as vLLM's text does.
CONTEXT_TOKENS = 4


class Detokenizer:
    """The tokenizers library's incremental decoder (one call a token, in Rust): it returns text
    only once a token completes a character, and handles the tokenizer's spacing itself."""

    def __init__(self, tok, prompt: list[int] | tuple[int, ...] = ()):
        from tokenizers.decoders import DecodeStream

        self.tok = tok
        self.ids: list[int] = []
        self._stream = DecodeStream(skip_special_tokens=True) if tok is not None else None
        if self._stream is not None and len(prompt):
            for t in list(prompt)[-CONTEXT_TOKENS:]:
                out = self._stream.step(tok.tok, int(t))
            if out is None:  # the prompt ends inside a character: its bytes stay the prompt's
                self._stream = DecodeStream(skip_special_tokens=True)

    def push(self, token: int) -> str:
        self.ids.append(token)
        if self.tok is None:
            return ""
        return self._stream.step(self.tok.tok, token) or ""


class TextStream:
    """A request's text: pushes tokens, returns what may be sent, and says when a stop
    string ends it (the text excludes the stop string and anything after it)."""

    def __init__(self, tok, stop: tuple[str, ...], prompt: list[int] | tuple[int, ...] = ()):
        self.detok = Detokenizer(tok, prompt)
        self.stop = stop
        self.hold = max((len(s) for s in stop), default=1) - 1
        self.text = ""  # everything decoded
        self.sent = 0
        self.stopped = False

    def push(self, token: int) -> str:
        self.text += self.detok.push(token)
        if self.stop:
            hits = [i for i in (self.text.find(s, max(0, self.sent - self.hold)) for s in self.stop) if i >= 0]
            if hits:
                self.text = self.text[:min(hits)]
                self.stopped = True
                return self.flush()
        end = len(self.text) - self.hold if self.stop else len(self.text)
        if end <= self.sent:
            return ""
        out = self.text[self.sent:end]
        self.sent = end
        return out

    def flush(self) -> str:
        """The withheld tail, at the end of the request."""
        out = self.text[self.sent:]
        self.sent = len(self.text)
        return out
