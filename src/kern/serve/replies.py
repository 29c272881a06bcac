"""OpenAI response bodies and stream chunks, built from the loop's Deltas (pure functions)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..generation.outputs import Delta, TokenLogprob
from . import tools as tool_calls


@dataclass(frozen=True, slots=True)
class Head:
    """What every body and chunk of one response repeats."""

    id: str
    created: int
    model: str
    chat: bool

    @property
    def object(self) -> str:
        return "chat.completion" if self.chat else "text_completion"

    @property
    def chunk_object(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"


@dataclass(slots=True)
class Choice:
    """One choice's text and logprobs so far, and its final counts."""

    text: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0

    def add(self, d: Delta) -> None:
        self.text.append(d.text)
        self.logprobs.extend(d.logprobs)
        self.finish_reason = d.finish_reason
        self.prompt_tokens, self.cached_tokens, self.completion_tokens = (d.prompt_tokens, d.cached_tokens,
                                                                         d.completion_tokens)


def usage(choices: list[Choice], n: int = 1) -> dict:
    """Each prompt counts once (its n choices share it); completions add up."""
    firsts = choices[::n]
    prompt, cached = sum(c.prompt_tokens for c in firsts), sum(c.cached_tokens for c in firsts)
    done = sum(c.completion_tokens for c in choices)
    return {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done,
            "prompt_tokens_details": {"cached_tokens": cached}}


def _token(decode, t: int) -> tuple[str, list[int]]:
    s = decode(t)
    return s, list(s.encode("utf-8"))


def chat_logprobs(decode, lps: list[TokenLogprob] | tuple[TokenLogprob, ...]) -> dict:
    content = []
    for lp in lps:
        s, b = _token(decode, lp.token)
        top = []
        for t, v in lp.top:
            ts, tb = _token(decode, t)
            top.append({"token": ts, "logprob": v, "bytes": tb})
        content.append({"token": s, "logprob": lp.logprob, "bytes": b, "top_logprobs": top})
    return {"content": content}


def completion_logprobs(decode, lps, offset: int) -> dict:
    """The legacy completions layout; text_offset counts characters from `offset`."""
    tokens, values, tops, offsets = [], [], [], []
    for lp in lps:
        s = decode(lp.token)
        tokens.append(s)
        values.append(lp.logprob)
        tops.append({decode(t): v for t, v in lp.top})
        offsets.append(offset)
        offset += len(s)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}


def body(head: Head, choices: list[Choice], decode, with_logprobs: bool, n: int = 1,
         echo: tuple[str, ...] | None = None, tools: tool_calls.ToolPlan | None = None) -> dict:
    """The whole response of a stream=false request. `echo`: each prompt's text, which its
    choices' text starts with; `tools`: how a chat message's tool calls are read."""
    out = []
    for i, c in enumerate(choices):
        text = "".join(c.text)
        lp = None
        if with_logprobs:
            lp = chat_logprobs(decode, c.logprobs) if head.chat else completion_logprobs(decode, c.logprobs, 0)
        if head.chat:
            message, finish = {"role": "assistant", "content": text}, c.finish_reason
            if tools is not None:
                content, calls = tool_calls.parse(text, tools)
                if calls:
                    message = {"role": "assistant", "content": content,
                               "tool_calls": tool_calls.message_calls(calls, tool_calls.CallIds(head.id, i))}
                    finish = "tool_calls" if finish == "stop" and tools.mode != "named" else finish
            out.append({"index": i, "message": message, "logprobs": lp, "finish_reason": finish})
        else:
            out.append({"index": i, "text": (echo[i // n] if echo else "") + text, "logprobs": lp,
                        "finish_reason": c.finish_reason})
    return {"id": head.id, "object": head.object, "created": head.created, "model": head.model, "choices": out,
            "usage": usage(choices, n)}


def chunk(head: Head, index: int, *, text: str | None = None, role: bool = False, finish: str | None = None,
          logprobs: dict | None = None, with_usage: bool = False, calls: list[dict] | None = None) -> dict:
    """One streamed choice update; finish_reason stays null until the choice's last chunk.
    `calls`: tool-call deltas (OpenAI's `delta.tool_calls`)."""
    if head.chat:
        delta = {}
        if role:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        if calls:
            delta["tool_calls"] = calls
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
    else:
        choice = {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish}
    out = {"id": head.id, "object": head.chunk_object, "created": head.created, "model": head.model,
           "choices": [choice]}
    if with_usage:
        out["usage"] = None
    return out


def usage_chunk(head: Head, choices: list[Choice], n: int = 1) -> dict:
    """The last chunk under stream_options.include_usage: no choices, the usage."""
    return {"id": head.id, "object": head.chunk_object, "created": head.created, "model": head.model,
            "choices": [], "usage": usage(choices, n)}


_COMPACT = (",", ":")


def sse(obj: dict | str) -> bytes:
    """One server-sent event: `data: <json>` and a blank line."""
    data = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False, separators=_COMPACT)
    return f"data: {data}\n\n".encode()


_json_str = json.encoder.encode_basestring  # what json.dumps(str, ensure_ascii=False) writes, without an encoder
_MARK = "\x00"  # text no other field of a chunk holds (JSON writes it as \u0000)


class TextChunks:
    """A stream's text chunks, pre-serialised: what `sse(chunk(head, i, text=t, with_usage=u))`
    writes, built once per choice as the bytes before and after the text, so a token costs one
    string encoding rather than a dict and a json.dumps of everything (id, model and created
    are constant for a request)."""

    def __init__(self, head: Head, with_usage: bool):
        self.head, self.with_usage = head, with_usage
        self._parts: dict[int, tuple[bytes, bytes]] = {}

    def __call__(self, index: int, text: str) -> bytes:
        parts = self._parts.get(index)
        if parts is None:
            whole = sse(chunk(self.head, index, text=_MARK, with_usage=self.with_usage))
            before, after = whole.split(json.dumps(_MARK).encode())
            parts = self._parts[index] = before, after
        return parts[0] + _json_str(text).encode() + parts[1]


DONE = sse("[DONE]")
