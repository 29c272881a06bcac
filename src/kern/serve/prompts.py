"""Prompts in: chat messages through the checkpoint's chat template (tool calls and tool results
included), and a completions prompt, one or several, as text or token ids."""

from __future__ import annotations

from ..errors import KernError
from .errors import RequestError, kind
from .formats import template_messages

MAX_PROMPTS = 64  # prompts in one completions request (each of n choices is a sequence in the loop)
ROLES = ("system", "developer", "user", "assistant", "tool")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_ids(v) -> bool:
    return isinstance(v, list) and all(_is_int(t) for t in v)


def _content(content, where: str, role: str) -> str:
    if isinstance(content, list):
        parts = []
        for j, p in enumerate(content):
            if not (isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)):
                raise RequestError(f"{where}.content[{j}]: only text parts are supported",
                                   param=f"{where}.content", code="unsupported_parameter")
            parts.append(p["text"])
        content = "".join(parts)
    if content is None and role == "assistant":
        content = ""
    if not isinstance(content, str):
        raise RequestError(f"{where}.content must be a string or an array of text parts, got {kind(content)}",
                           param=f"{where}.content", code="invalid_type")
    return content


def _tool_calls(calls, where: str) -> list[dict]:
    if not isinstance(calls, list):
        raise RequestError(f"{where}.tool_calls must be an array, got {kind(calls)}", param=where, code="invalid_type")
    for k, c in enumerate(calls):
        fn = c.get("function") if isinstance(c, dict) else None
        if not (isinstance(fn, dict) and isinstance(fn.get("name"), str) and isinstance(fn.get("arguments"), str)):
            raise RequestError(f"{where}.tool_calls[{k}] must be {{\"id\", \"type\": \"function\", \"function\": "
                               "{\"name\", \"arguments\": JSON text}}", param=where)
    return calls


def messages(ms: list) -> list[dict]:
    """Chat messages for the template: role and text content (text parts joined); an
    assistant's tool_calls and a tool message's tool_call_id pass through."""
    if not ms:
        raise RequestError("messages must hold at least one message", param="messages")
    out = []
    for i, m in enumerate(ms):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise RequestError(f"{where} must be an object, got {kind(m)}", param=where, code="invalid_type")
        role = m.get("role")
        allowed = {"role", "content", "name"} | ({"tool_calls"} if role == "assistant" else set()) \
            | ({"tool_call_id"} if role == "tool" else set())
        extra = set(m) - allowed
        if extra:
            raise RequestError(f"{where}: unsupported field {sorted(extra)[0]!r}", param=where,
                               code="unsupported_parameter")
        if role not in ROLES:
            raise RequestError(f"{where}.role must be one of {', '.join(ROLES)}; got {role!r}", param=f"{where}.role")
        msg = {"role": "system" if role == "developer" else role, "content": _content(m.get("content"), where, role)}
        for k in ("name", "tool_call_id"):
            if m.get(k) is not None:
                if not isinstance(m[k], str):
                    raise RequestError(f"{where}.{k} must be a string, got {kind(m[k])}", param=where,
                                       code="invalid_type")
                msg[k] = m[k]
        if m.get("tool_calls"):
            msg["tool_calls"] = _tool_calls(m["tool_calls"], where)
        out.append(msg)
    return out


def chat_ids(tokenizer, ms: list, tools: list | None = None) -> list[int]:
    from jinja2.exceptions import TemplateError

    try:
        text = tokenizer.chat(template_messages(messages(ms)), tools=tools)
    except TemplateError as e:
        raise RequestError(f"the model's chat template refused these messages: {e}", param="messages") from None
    except KernError as e:
        if isinstance(e, RequestError):
            raise
        raise RequestError(str(e), param="messages") from None
    return tokenizer.encode(text)


def completion_prompts(prompt, tokenizer, vocab: int) -> list[tuple[list[int], str | None]]:
    """Each prompt's token ids and, for a text prompt, its text (what `echo` repeats): a string,
    an array of token ids, or an array of either (several prompts in one request)."""
    batch = prompt if isinstance(prompt, list) and prompt and not _is_int(prompt[0]) else [prompt]
    if not batch or batch == [[]]:
        raise RequestError("prompt is empty", param="prompt")
    if len(batch) > MAX_PROMPTS:
        raise RequestError(f"prompt holds {len(batch)} prompts; a request may hold at most {MAX_PROMPTS}",
                           param="prompt")
    out = []
    for i, p in enumerate(batch):
        where = "prompt" if len(batch) == 1 and batch[0] is prompt else f"prompt[{i}]"
        if isinstance(p, str):
            out.append((tokenizer.encode(p), p))
            continue
        if not _is_ids(p):
            raise RequestError(f"{where} must be a string or an array of token ids, got {kind(p)}", param="prompt",
                               code="invalid_type")
        bad = [t for t in p if not 0 <= t < vocab]
        if bad:
            raise RequestError(f"{where} holds token id {bad[0]}, outside the vocabulary [0, {vocab})",
                               param="prompt")
        out.append((list(p), None))
    return out
