"""The request fields that shape what the model may say: `response_format`, `logit_bias`,
`tools`, `tool_choice` and `parallel_tool_calls`; each checked here, in kern's own words, and
turned into the loop's terms (a grammar, a bias) and the tool plan replies.py reads output by.

A JSON schema becomes an llguidance grammar at the door: a keyword it does not implement is a
400 naming it (`uniqueItems`, `not`, ...), never dropped."""

from __future__ import annotations

import json
import math
import re

from ..generation.constraints import cached_problem, json_schema_grammar
from .tools import ToolPlan, template_tools
from .errors import RequestError, kind


def _schema_grammar(schema, where: str) -> str:
    """The grammar of a schema at `where` (a field path: response_format.json_schema.schema,
    tools[1].function.parameters), or a 400 naming the path and the keyword at fault."""
    param = re.match(r"[a-z_]+", where).group()  # the request field: response_format, tools
    if not isinstance(schema, (dict, bool)):
        raise RequestError(f"{where} must be a JSON schema (an object), got {kind(schema)}", param=param,
                           code="invalid_type")
    try:
        grammar = json_schema_grammar(schema)
    except (ValueError, RuntimeError) as e:
        raise RequestError(f"{where}: not a JSON schema kern can decode by: {e}", param=param,
                           code="unsupported_schema") from None
    problem = cached_problem(grammar)
    if problem is not None:
        raise RequestError(f"{where}: unsupported JSON schema: {_short(problem)}", param=param,
                           code="unsupported_schema")
    return grammar


def _short(problem: str) -> str:
    """llguidance's message, its first line (later lines list internal context)."""
    return problem.strip().splitlines()[0]


def response_format(value) -> str | None:
    """The grammar a response_format asks for (None: free text)."""
    if not isinstance(value, dict):
        raise RequestError(f"response_format must be an object, got {kind(value)}", param="response_format",
                           code="invalid_type")
    t = value.get("type")
    if t == "text":
        return None
    if t == "json_object":
        return _schema_grammar({"type": "object"}, "response_format")
    if t == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec:
            raise RequestError("response_format.json_schema must be an object holding the schema under 'schema'",
                               param="response_format")
        return _schema_grammar(spec["schema"], "response_format.json_schema.schema")
    raise RequestError(f"response_format.type must be text, json_object or json_schema; got {t!r}",
                       param="response_format")


def logit_bias(value, vocab: int) -> tuple[tuple[int, float], ...]:
    """OpenAI's map of token id (a string key) to a bias in [-100, 100], as sorted pairs."""
    if not isinstance(value, dict):
        raise RequestError(f"logit_bias must be an object of token id to bias, got {kind(value)}",
                           param="logit_bias", code="invalid_type")
    out = []
    for key, bias in value.items():
        if not key.isdigit() or not 0 <= int(key) < vocab:
            raise RequestError(f"logit_bias key {key!r} is not a token id in [0, {vocab})", param="logit_bias")
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not math.isfinite(bias) \
                or not -100 <= bias <= 100:
            raise RequestError(f"logit_bias[{key!r}] must be a number in [-100, 100], got {bias!r}",
                               param="logit_bias")
        out.append((int(key), float(bias)))
    return tuple(sorted(out))


def _functions(tools) -> list[dict]:
    if not isinstance(tools, list) or not tools:
        raise RequestError("tools must be a non-empty array of tools", param="tools", code="invalid_type")
    seen = []
    for i, t in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("function"), dict):
            raise RequestError(f"{where} must be {{\"type\": \"function\", \"function\": {{...}}}}", param="tools")
        f = t["function"]
        name = f.get("name")
        if not isinstance(name, str) or not name:
            raise RequestError(f"{where}.function.name must be a non-empty string", param="tools")
        if name in (s["name"] for s in seen):
            raise RequestError(f"{where}: a second function named {name!r}", param="tools")
        params = f.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise RequestError(f"{where}.function.parameters must be a JSON schema object, got {kind(params)}",
                               param="tools", code="invalid_type")
        seen.append({"name": name, "parameters": params, "where": where})
    return seen


def tool_plan(f: dict, tokenizer) -> tuple[ToolPlan | None, list | None, str | None]:
    """(how to read the output, the tools for the chat template, the grammar to decode under)
    for a chat request's tools fields; (None, None, None) where it has no tools to call."""
    if f.get("tools") == []:  # some clients send an empty list for "no tools"
        f = {k: v for k, v in f.items() if k != "tools"}
    choice = f.get("tool_choice", "auto" if "tools" in f else "none")
    parallel = f.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise RequestError(f"parallel_tool_calls must be a boolean, got {kind(parallel)}",
                           param="parallel_tool_calls", code="invalid_type")
    named = None
    if isinstance(choice, dict):
        fn = choice.get("function")
        if choice.get("type") != "function" or not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise RequestError('tool_choice must be "none", "auto", "required" or {"type": "function", '
                               '"function": {"name": ...}}', param="tool_choice")
        named = fn["name"]
    elif choice not in ("none", "auto", "required"):
        raise RequestError(f'tool_choice must be "none", "auto", "required" or a named function; got {choice!r}',
                           param="tool_choice")
    if "tools" not in f:
        if choice != "none":
            raise RequestError(f"tool_choice {choice!r} needs tools", param="tool_choice")
        return None, None, None
    funcs = _functions(f["tools"])
    if choice == "none":
        return None, None, None  # the tools are not rendered: the model is not told of them
    fmt = template_tools(tokenizer)
    if named is not None:
        fn = next((g for g in funcs if g["name"] == named), None)
        if fn is None:
            raise RequestError(f"tool_choice names {named!r}, which is not among the tools", param="tool_choice")
        grammar = _schema_grammar(fn["parameters"], f"{fn['where']}.function.parameters")
        return ToolPlan("named", fmt, parallel, named), f["tools"], grammar
    if choice == "required":
        for g in funcs:  # each function's schema named on its own when it is what fails
            _schema_grammar(g["parameters"], f"{g['where']}.function.parameters")
        calls = {"type": "array", "minItems": 1, "items": {"anyOf": [
            {"type": "object", "properties": {"name": {"const": g["name"]}, "parameters": g["parameters"]},
             "required": ["name", "parameters"], "additionalProperties": False} for g in funcs]}}
        if not parallel:
            calls["maxItems"] = 1
        return ToolPlan("required", fmt, parallel), f["tools"], _schema_grammar(calls, "tools")
    return ToolPlan("auto", fmt, parallel), f["tools"], None


def template_messages(messages: list[dict]) -> list[dict]:
    """Assistant tool calls as chat templates read them: arguments as an object, not the JSON
    text OpenAI's clients send (Hugging Face templates write `arguments | tojson`)."""
    out = []
    for m in messages:
        if "tool_calls" in m:
            calls = []
            for c in m["tool_calls"]:
                fn = dict(c["function"])
                try:
                    fn["arguments"] = json.loads(fn["arguments"]) if isinstance(fn["arguments"], str) else fn["arguments"]
                except ValueError:
                    pass  # not JSON: the template gets the text as it came
                calls.append({**c, "function": fn})
            m = {**m, "tool_calls": calls}
        out.append(m)
    return out
