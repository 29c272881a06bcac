"""OpenAI request bodies in, typed jobs out: every field checked by the table below, every
refusal an OpenAI-shaped error naming the field in kern's own words (never a parser's text,
which changes between releases)."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, replace

from ..generation.params import SamplingParams
from ..errors import KernError
from ..runtime.errors import BoundsError

MAX_N = 16  # choices per request: each is a sequence of its own in the loop


class RequestError(KernError):
    """A request the server refuses: the HTTP status and the OpenAI error object's fields."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None, status: int = 400,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.message, self.param, self.code, self.status, self.kind = message, param, code, status, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclass(frozen=True, slots=True)
class Job:
    """One checked request: `n` sequences of `prompt_ids` under `params` (choice i seeded seed + i)."""

    chat: bool
    prompt_ids: list[int]
    params: SamplingParams
    n: int
    stream: bool
    include_usage: bool
    logprobs: bool  # the response carries logprobs (params.logprobs holds how many alternatives)

    def choice_params(self, i: int) -> SamplingParams:
        """Choice i's params: distinct seeds, so n seeded choices differ yet each reproduces."""
        seed = self.params.seed
        return self.params if seed is None or i == 0 else replace(self.params, seed=seed + i)


class HugeInt:
    """A JSON integer of more digits than Python converts (sys.get_int_max_str_digits): refused
    by the field that holds it, not as unparsable JSON."""

    def __init__(self, digits: str):
        self.digits = len(digits.lstrip("-"))


def _int_or_huge(text: str):
    try:
        return int(text)
    except ValueError:
        return HugeInt(text)


def _kind(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, int):
        return "an integer"
    if isinstance(v, HugeInt):
        return f"an integer of {v.digits} digits"
    if isinstance(v, float):
        return "a number" if math.isfinite(v) else str(v).replace("inf", "Infinity").replace("nan", "NaN")
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "an array"
    return "an object"


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return (_is_int(v) or isinstance(v, float)) and math.isfinite(v)


def _is_str_or_strs(v) -> bool:
    return isinstance(v, str) or (isinstance(v, list) and all(isinstance(s, str) for s in v))


def _is_ids(v) -> bool:
    return isinstance(v, list) and all(_is_int(t) for t in v)


# field -> (check of its JSON type, the type in words). Null counts as absent everywhere.
TYPES = {
    "model": (lambda v: isinstance(v, str), "a string"),
    "stream": (lambda v: isinstance(v, bool), "a boolean"),
    "stream_options": (lambda v: isinstance(v, dict), "an object"),
    "max_tokens": (_is_int, "an integer"),
    "max_completion_tokens": (_is_int, "an integer"),
    "temperature": (_is_num, "a number"),
    "top_p": (_is_num, "a number"),
    "top_k": (_is_int, "an integer"),
    "min_p": (_is_num, "a number"),
    "repetition_penalty": (_is_num, "a number"),
    "frequency_penalty": (_is_num, "a number"),
    "presence_penalty": (_is_num, "a number"),
    "seed": (_is_int, "an integer"),
    "stop": (_is_str_or_strs, "a string or an array of strings"),
    "stop_token_ids": (_is_ids, "an array of integers"),
    "n": (_is_int, "an integer"),
    "ignore_eos": (lambda v: isinstance(v, bool), "a boolean"),
    "user": (lambda v: isinstance(v, str), "a string"),
    "messages": (lambda v: isinstance(v, list), "an array of messages"),
    "prompt": (lambda v: isinstance(v, str) or _is_ids(v) or (isinstance(v, list) and len(v) == 1),
               "a string or an array of token ids"),
    "top_logprobs": (_is_int, "an integer"),
}
COMMON = ("model", "stream", "stream_options", "max_tokens", "temperature", "top_p", "top_k", "min_p",
          "repetition_penalty", "frequency_penalty", "presence_penalty", "seed", "stop", "stop_token_ids", "n",
          "ignore_eos", "user")
FIELDS = {
    True: frozenset(COMMON + ("messages", "max_completion_tokens", "logprobs", "top_logprobs")),
    False: frozenset(COMMON + ("prompt", "logprobs")),
}
# Fields kern does not implement, accepted only at the value that changes nothing.
INERT = {"echo": False, "best_of": 1, "logit_bias": {}, "tools": [], "parallel_tool_calls": True,
         "response_format": {"type": "text"}}


def parse_body(raw: bytes) -> dict:
    try:
        body = json.loads(raw, parse_int=_int_or_huge)
    except RecursionError:
        raise RequestError("the request body nests arrays or objects too deeply", code="invalid_json") from None
    except (ValueError, UnicodeDecodeError):
        raise RequestError("the request body is not valid JSON", code="invalid_json") from None
    if not isinstance(body, dict):
        raise RequestError(f"the request body must be a JSON object, got {_kind(body)}", code="invalid_json")
    _no_lone_surrogates(body)
    return body


def _no_lone_surrogates(body: dict) -> None:
    """JSON may escape half a UTF-16 pair ("\\ud800"), which no tokenizer (nor UTF-8) takes: refuse
    it naming where it is. Iterative: the body may nest as deep as the parser allowed."""
    todo: list[tuple[str | None, object]] = [(None, body)]
    while todo:
        where, v = todo.pop()
        if isinstance(v, dict):
            for k, x in v.items():
                _text(k, where, "a field name in ")
                todo.append((k if where is None else f"{where}.{k}", x))
        elif isinstance(v, list):
            todo += [(f"{where}[{i}]", x) for i, x in enumerate(v)]
        else:
            _text(v, where)


def _text(v, where: str | None, what: str = "") -> None:
    if isinstance(v, str):
        try:
            v.encode("utf-8")
        except UnicodeEncodeError as e:
            place = where or "the request body"
            raise RequestError(f"{what}{place} holds a lone surrogate ({v[e.start]!r} at character {e.start}), "
                               "which is not text", param=where, code="invalid_text") from None


def _fields(body: dict, chat: bool) -> dict:
    """The body's known, non-null fields, each of its JSON type; refuses the rest by name."""
    out = {}
    for name, value in body.items():
        if value is None:
            continue
        if name not in FIELDS[chat]:
            if name in INERT and value == INERT[name]:
                continue
            raise RequestError(f"unsupported parameter {name!r}" + (f" (kern accepts only {INERT[name]!r})"
                               if name in INERT else ""), param=name, code="unsupported_parameter")
        if isinstance(value, HugeInt):
            raise RequestError(f"{name} is an integer of {value.digits} digits, more than kern reads "
                               f"({sys.get_int_max_str_digits()})", param=name, code="invalid_value")
        if name == "logprobs":
            ok, words = (lambda v: isinstance(v, bool), "a boolean") if chat else (_is_int, "an integer")
        else:
            ok, words = TYPES[name]
        if not ok(value):
            raise RequestError(f"{name} must be {words}, got {_kind(value)}", param=name, code="invalid_type")
        out[name] = value
    return out


def _messages(messages: list) -> list[dict]:
    """Chat messages for the template: role and text content (text parts joined)."""
    if not messages:
        raise RequestError("messages must hold at least one message", param="messages")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise RequestError(f"{where} must be an object, got {_kind(m)}", param=where, code="invalid_type")
        extra = set(m) - {"role", "content", "name"}
        if extra:
            raise RequestError(f"{where}: unsupported field {sorted(extra)[0]!r}", param=where,
                               code="unsupported_parameter")
        role, content = m.get("role"), m.get("content")
        if role not in ("system", "developer", "user", "assistant"):
            raise RequestError(f"{where}.role must be one of system, developer, user, assistant; got {role!r}",
                               param=f"{where}.role")
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
            raise RequestError(f"{where}.content must be a string or an array of text parts, got {_kind(content)}",
                               param=f"{where}.content", code="invalid_type")
        msg = {"role": "system" if role == "developer" else role, "content": content}
        if "name" in m:
            msg["name"] = m["name"]
        out.append(msg)
    return out


def _prompt_ids(f: dict, chat: bool, tokenizer, vocab: int) -> list[int]:
    if chat:
        from jinja2.exceptions import TemplateError

        try:
            text = tokenizer.chat(_messages(f["messages"]))
        except TemplateError as e:
            raise RequestError(f"the model's chat template refused these messages: {e}", param="messages") from None
        except KernError as e:
            if isinstance(e, RequestError):
                raise
            raise RequestError(str(e), param="messages") from None
        return tokenizer.encode(text)
    prompt = f["prompt"]
    if isinstance(prompt, list) and len(prompt) == 1 and not _is_int(prompt[0]):
        prompt = prompt[0]  # a batch of one prompt
        if not (isinstance(prompt, str) or _is_ids(prompt)):
            raise RequestError(f"prompt[0] must be a string or an array of token ids, got {_kind(prompt)}",
                               param="prompt", code="invalid_type")
    if isinstance(prompt, str):
        return tokenizer.encode(prompt)
    bad = [t for t in prompt if not 0 <= t < vocab]
    if bad:
        raise RequestError(f"prompt holds token id {bad[0]}, outside the vocabulary [0, {vocab})", param="prompt")
    return list(prompt)


def parse(body: dict, *, chat: bool, tokenizer, vocab: int, context: int, model_name: str,
          aliases: tuple[str, ...] = ()) -> Job:
    """A checked Job from a request body, or RequestError naming the first field at fault.
    `aliases`: other names the model answers to (the path the server was started with)."""
    required = "messages" if chat else "prompt"
    for name in ("model", required):
        if body.get(name) is None:
            raise RequestError(f"missing required field {name!r}", param=name, code="missing_field")
    f = _fields(body, chat)
    if f["model"] != model_name and f["model"] not in aliases:
        raise RequestError(f"the model {f['model']!r} does not exist; this server serves {model_name!r}",
                           param="model", code="model_not_found", status=404)
    n = f.get("n", 1)
    if not 1 <= n <= MAX_N:
        raise RequestError(f"n must be in [1, {MAX_N}], got {n}", param="n")
    stream = f.get("stream", False)
    opts = f.get("stream_options", {})
    if opts and not stream:
        raise RequestError("stream_options is only allowed with stream: true", param="stream_options")
    if set(opts) - {"include_usage"} or not isinstance(opts.get("include_usage", False), bool):
        raise RequestError("stream_options accepts only include_usage, a boolean", param="stream_options")

    ids = _prompt_ids(f, chat, tokenizer, vocab)
    if not ids:
        raise RequestError(f"{required} is empty after tokenizing", param=required)
    room = context - len(ids)
    if room < 1:
        raise RequestError(f"the prompt is {len(ids)} tokens; this model's context is {context} positions, "
                           f"so a prompt may hold at most {context - 1}", param=required,
                           code="context_length_exceeded")
    budget = "max_completion_tokens" if "max_completion_tokens" in f else "max_tokens"
    max_tokens = f.get(budget, room if chat else min(16, room))
    if max_tokens < 1:
        raise RequestError(f"{budget} must be at least 1, got {max_tokens}", param=budget)
    if max_tokens > room:
        raise RequestError(f"{budget} is {max_tokens}, but the prompt's {len(ids)} tokens leave room for at most "
                           f"{room} in this model's context of {context} positions", param=budget,
                           code="context_length_exceeded")

    if chat:
        if "top_logprobs" in f and not f.get("logprobs", False):
            raise RequestError("top_logprobs needs logprobs: true", param="top_logprobs")
        logprobs = f.get("top_logprobs", 0) if f.get("logprobs", False) else None
    else:
        logprobs = f.get("logprobs")
    stop = f.get("stop", ())
    top_k = f.get("top_k", 0)
    try:
        params = SamplingParams(
            max_tokens=max_tokens, temperature=float(f.get("temperature", 1.0)),
            top_p=float(f.get("top_p", 1.0)), top_k=0 if top_k == -1 else top_k, min_p=float(f.get("min_p", 0.0)),
            repetition_penalty=float(f.get("repetition_penalty", 1.0)),
            frequency_penalty=float(f.get("frequency_penalty", 0.0)),
            presence_penalty=float(f.get("presence_penalty", 0.0)), seed=f.get("seed"),
            stop=(stop,) if isinstance(stop, str) else tuple(stop), stop_token_ids=tuple(f.get("stop_token_ids", ())),
            ignore_eos=f.get("ignore_eos", False), logprobs=logprobs)
        params.check()
    except BoundsError as e:
        field = str(e).split(" ", 1)[0]
        param = "top_logprobs" if chat and field == "logprobs" else field
        raise RequestError(str(e).replace(field, param, 1), param=param) from None
    return Job(chat, ids, params, n, stream, stream and opts.get("include_usage", False), logprobs is not None)
