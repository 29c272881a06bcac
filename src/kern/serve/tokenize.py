"""`/tokenize` and `/detokenize` in vLLM's shapes: text or chat messages to token ids as a
completion or a chat request would see them, and token ids back to text."""

from __future__ import annotations

from . import formats, prompts
from .errors import RequestError, kind

_BOOL = ("add_special_tokens", "add_generation_prompt", "return_token_strs", "continue_final_message")
FIELDS = {"model", "prompt", "messages", "tools", "tokens", *_BOOL}


def _check(body: dict, allowed: set[str], model_name: str, aliases: tuple[str, ...]) -> dict:
    f = {k: v for k, v in body.items() if v is not None}
    for name in f:
        if name not in allowed:
            raise RequestError(f"unsupported parameter {name!r}", param=name, code="unsupported_parameter")
        if name in _BOOL and not isinstance(f[name], bool):
            raise RequestError(f"{name} must be a boolean, got {kind(f[name])}", param=name, code="invalid_type")
    if "model" in f and f["model"] != model_name and f["model"] not in aliases:
        raise RequestError(f"the model {f['model']!r} does not exist; this server serves {model_name!r}",
                           param="model", code="model_not_found", status=404)
    return f


def tokenize(body: dict, *, tokenizer, vocab: int, context: int, model_name: str, aliases: tuple[str, ...] = ()) -> dict:
    """{count, max_model_len, tokens, token_strs} for `prompt` (special tokens added unless
    add_special_tokens is false) or `messages` (through the chat template, with `tools`)."""
    f = _check(body, FIELDS - {"tokens"}, model_name, aliases)
    if ("prompt" in f) == ("messages" in f):
        raise RequestError("send one of prompt or messages", param="prompt", code="missing_field")
    if f.get("continue_final_message"):
        raise RequestError("continue_final_message is not supported", param="continue_final_message",
                           code="unsupported_parameter")
    if "prompt" in f:
        if not isinstance(f["prompt"], str):
            raise RequestError(f"prompt must be a string, got {kind(f['prompt'])}", param="prompt", code="invalid_type")
        ids = tokenizer.encode(f["prompt"], special=f.get("add_special_tokens", True))
    else:
        if not isinstance(f["messages"], list):
            raise RequestError(f"messages must be an array of messages, got {kind(f['messages'])}", param="messages",
                               code="invalid_type")
        tools = None
        if "tools" in f:
            formats.tool_plan({"tools": f["tools"]}, tokenizer)  # the template must render them
            tools = f["tools"]
        text = tokenizer.chat(formats.template_messages(prompts.messages(f["messages"])),
                              add_generation_prompt=f.get("add_generation_prompt", True), tools=tools)
        ids = tokenizer.encode(text, special=f.get("add_special_tokens", False))
    strs = [tokenizer.tok.id_to_token(t) for t in ids] if f.get("return_token_strs") else None
    return {"count": len(ids), "max_model_len": context, "tokens": ids, "token_strs": strs}


def detokenize(body: dict, *, tokenizer, vocab: int, model_name: str, aliases: tuple[str, ...] = ()) -> dict:
    """{prompt}: the text of `tokens` (special tokens left out, as a completion's text)."""
    f = _check(body, {"model", "tokens"}, model_name, aliases)
    ids = f.get("tokens")
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise RequestError(f"tokens must be an array of token ids, got {kind(ids)}", param="tokens",
                           code="invalid_type" if ids is not None else "missing_field")
    bad = [t for t in ids if not 0 <= t < vocab]
    if bad:
        raise RequestError(f"tokens holds token id {bad[0]}, outside the vocabulary [0, {vocab})", param="tokens")
    return {"prompt": tokenizer.decode(ids)}
