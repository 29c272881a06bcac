"""OpenAI request bodies in, typed jobs out: every field checked by the table below, every
refusal an OpenAI-shaped error naming the field in kern's own words (never a parser's text,
which changes between releases)."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, replace

from ..generation.params import ContextError, SamplingParams, context_room
from . import formats, prompts as prompts_in
from .errors import HugeInt, RequestError, kind as _kind
from .tools import ToolPlan
from ..errors import BoundsError

MAX_N = 16  # choices per request: each is a sequence of its own in the loop


@dataclass(frozen=True, slots=True)
class Job:
    """One checked request: `n` sequences of each prompt under `params`; choice i is prompt
    i // n's (i % n)-th, seeded seed + i % n (so a prompt's choices are those it gets alone)."""

    chat: bool
    prompts: tuple[list[int], ...]
    params: SamplingParams
    n: int
    stream: bool
    include_usage: bool
    logprobs: bool  # the response carries logprobs (params.logprobs holds how many alternatives)
    echo: tuple[str, ...] | None = None  # completions with echo: each prompt's text, which its choices start with
    tools: ToolPlan | None = None  # chat with tools: how the output is read (serve/tools.py)

    @property
    def choices(self) -> int:
        return len(self.prompts) * self.n

    def choice_prompt(self, i: int) -> list[int]:
        return self.prompts[i // self.n]

    def choice_params(self, i: int) -> SamplingParams:
        """Choice i's params: distinct seeds, so n seeded choices differ yet each reproduces."""
        seed, k = self.params.seed, i % self.n
        return self.params if seed is None or k == 0 else replace(self.params, seed=seed + k)


def _int_or_huge(text: str):
    try:
        return int(text)
    except ValueError:
        return HugeInt(text)


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
    "prompt": (lambda v: isinstance(v, (str, list)), "a string, an array of token ids or an array of prompts"),
    "top_logprobs": (_is_int, "an integer"),
    "response_format": (lambda v: isinstance(v, dict), "an object"),
    "logit_bias": (lambda v: isinstance(v, dict), "an object"),
    "tools": (lambda v: isinstance(v, list), "an array"),
    "tool_choice": (lambda v: isinstance(v, (str, dict)), "a string or an object"),
    "parallel_tool_calls": (lambda v: isinstance(v, bool), "a boolean"),
    "echo": (lambda v: isinstance(v, bool), "a boolean"),
}
COMMON = ("model", "stream", "stream_options", "max_tokens", "temperature", "top_p", "top_k", "min_p",
          "repetition_penalty", "frequency_penalty", "presence_penalty", "seed", "stop", "stop_token_ids", "n",
          "ignore_eos", "user", "response_format", "logit_bias")
FIELDS = {
    True: frozenset(COMMON + ("messages", "max_completion_tokens", "logprobs", "top_logprobs", "tools", "tool_choice",
                              "parallel_tool_calls")),
    False: frozenset(COMMON + ("prompt", "logprobs", "echo")),
}
# Fields kern does not implement, accepted only at the value that changes nothing.
INERT = {"best_of": 1, "echo": False, "tools": []}


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

    plan, grammar = None, f.get("response_format") and formats.response_format(f["response_format"])
    if chat:
        plan, tools, tool_grammar = formats.tool_plan(f, tokenizer)
        if tool_grammar is not None and grammar is not None:
            raise RequestError("response_format json_object or json_schema and a tool_choice that forces a call "
                               "both constrain the output: send one", param="response_format")
        grammar = grammar or tool_grammar
        prompts = [(prompts_in.chat_ids(tokenizer, f["messages"], tools), None)]
    else:
        prompts = prompts_in.completion_prompts(f["prompt"], tokenizer, vocab)
    if f.get("echo") and f.get("logprobs") is not None:
        raise RequestError("echo with logprobs asks for the prompt's logprobs, which kern does not compute",
                           param="echo", code="unsupported_parameter")
    budget = "max_completion_tokens" if "max_completion_tokens" in f else "max_tokens"
    max_tokens = min(_max_tokens(ids, i, len(prompts), required, context, f, budget, chat) for i, (ids, _) in
                     enumerate(prompts))

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
            ignore_eos=f.get("ignore_eos", False), logprobs=logprobs,
            logit_bias=formats.logit_bias(f["logit_bias"], vocab) if "logit_bias" in f else (), grammar=grammar)
        params.check()
    except BoundsError as e:
        field = str(e).split(" ", 1)[0]
        param = {"logprobs": "top_logprobs" if chat else "logprobs", "max_tokens": budget}.get(field, field)
        raise RequestError(str(e).replace(field, param, 1), param=param) from None
    echo = tuple(text if text is not None else tokenizer.decode(ids) for ids, text in prompts) \
        if f.get("echo") else None
    return Job(chat, tuple(ids for ids, _ in prompts), params, n, stream, stream and opts.get("include_usage", False),
               logprobs is not None, echo, plan)


def _max_tokens(ids: list[int], i: int, count: int, required: str, context: int, f: dict, budget: str,
                chat: bool) -> int:
    """The max_tokens prompt i asks for (its default where the request gives none: OpenAI's,
    what the context leaves for chat, at most 16 for completions), or a 400 where the context
    has no room for it (SamplingParams.check refuses one below 1)."""
    where = required if count == 1 else f"{required}[{i}]"
    if not ids:
        raise RequestError(f"{where} is empty after tokenizing", param=required)
    try:
        room = context_room(len(ids), context, f.get(budget))
    except ContextError as e:
        raise RequestError(str(e).replace("max_tokens", budget, 1), param=required if e.field == "prompt" else budget,
                           code="context_length_exceeded") from None
    return f.get(budget, room if chat else min(16, room))
