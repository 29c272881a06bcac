"""Bad requests get an OpenAI-shaped 4xx naming the field, in kern's own words, and the server
keeps serving everyone else."""

from __future__ import annotations

import json

import pytest

from .conftest import CONTEXT, post, words

M = "MODEL"  # replaced by the served model's name


def chat(**kw):
    return {"model": M, "messages": [{"role": "user", "content": "w5 w6"}], **kw}


def comp(**kw):
    return {"model": M, "prompt": "w5 w6", **kw}


# (case, path, body, status, param, words the message holds)
CASES = [
    ("malformed JSON", "chat", b'{"model": ', 400, None, "not valid JSON"),
    ("not an object", "chat", b"[1, 2]", 400, None, "must be a JSON object, got an array"),
    ("no model", "chat", {"messages": [{"role": "user", "content": "w5"}]}, 400, "model", "missing required field"),
    ("no messages", "chat", {"model": M}, 400, "messages", "missing required field 'messages'"),
    ("no prompt", "completions", {"model": M}, 400, "prompt", "missing required field 'prompt'"),
    ("unknown model", "chat", chat(model="gpt-17"), 404, "model", "'gpt-17' does not exist"),
    ("model not a string", "chat", chat(model=3), 400, "model", "model must be a string, got an integer"),
    ("temperature a string", "chat", chat(temperature="hot"), 400, "temperature", "must be a number, got a string"),
    ("max_tokens a float", "completions", comp(max_tokens=2.5), 400, "max_tokens", "must be an integer, got a number"),
    ("stream a string", "chat", chat(stream="yes"), 400, "stream", "must be a boolean"),
    ("stop a number", "chat", chat(stop=5), 400, "stop", "a string or an array of strings"),
    ("messages not a list", "chat", chat(messages="w5"), 400, "messages", "must be an array of messages"),
    ("message not an object", "chat", chat(messages=["w5"]), 400, "messages[0]", "must be an object"),
    ("unknown role", "chat", chat(messages=[{"role": "robot", "content": "w5"}]), 400, "messages[0].role",
     "must be one of"),
    ("image content", "chat", chat(messages=[{"role": "user", "content": [{"type": "image_url"}]}]), 400,
     "messages[0].content", "only text parts"),
    ("empty messages", "chat", chat(messages=[]), 400, "messages", "at least one message"),
    ("negative max_tokens", "chat", chat(max_tokens=-1), 400, "max_tokens", "must be an integer >= 1, got -1"),
    ("zero max_completion_tokens", "chat", chat(max_completion_tokens=0), 400, "max_completion_tokens",
     "max_completion_tokens must be an integer >= 1, got 0"),
    ("huge max_tokens", "completions", comp(max_tokens=10**9), 400, "max_tokens", "leave room for at most"),
    ("prompt over the context", "completions", comp(prompt=words(CONTEXT + 5)), 400, "prompt",
     f"context is {CONTEXT} positions"),
    ("token id outside the vocabulary", "completions", comp(prompt=[1, 99999]), 400, "prompt",
     "outside the vocabulary"),
    ("top_p above 1", "chat", chat(top_p=2), 400, "top_p", "top_p must be in (0, 1]"),
    ("negative temperature", "completions", comp(temperature=-1), 400, "temperature", ">= 0"),
    ("presence_penalty out of range", "chat", chat(presence_penalty=3), 400, "presence_penalty", "[-2, 2]"),
    ("negative seed", "chat", chat(seed=-4), 400, "seed", "integer >= 0"),
    ("too many top_logprobs", "chat", chat(logprobs=True, top_logprobs=50), 400, "top_logprobs", "[0, 20]"),
    ("top_logprobs without logprobs", "chat", chat(top_logprobs=2), 400, "top_logprobs", "needs logprobs: true"),
    ("chat logprobs not a boolean", "chat", chat(logprobs=3), 400, "logprobs", "must be a boolean"),
    ("n zero", "chat", chat(n=0), 400, "n", "n must be in [1, 16]"),
    ("empty stop string", "chat", chat(stop=[""]), 400, "stop", "non-empty strings"),
    ("stream_options without stream", "chat", chat(stream_options={"include_usage": True}), 400, "stream_options",
     "only allowed with stream: true"),
    ("a tool without its function", "chat", chat(tools=[{"type": "function"}]), 400, "tools",
     'tools[0] must be {"type": "function", "function": {...}}'),
    ("tools through a template without a tool section", "chat",
     chat(tools=[{"type": "function", "function": {"name": "f"}}]), 400, "tools", "has no tool section"),
    ("tool_choice of no kind", "chat", chat(tool_choice="always"), 400, "tool_choice", 'must be "none", "auto"'),
    ("tool_choice without tools", "chat", chat(tool_choice="required"), 400, "tool_choice", "needs tools"),
    ("echo with logprobs", "completions", comp(echo=True, logprobs=1), 400, "echo", "prompt's logprobs"),
    ("echo a string", "completions", comp(echo="yes"), 400, "echo", "echo must be a boolean"),
    ("logit_bias key not a token", "chat", chat(logit_bias={"w5": 3}), 400, "logit_bias",
     "logit_bias key 'w5' is not a token id"),
    ("logit_bias out of range", "completions", comp(logit_bias={"7": 101}), 400, "logit_bias", "[-100, 100]"),
    ("response_format of no kind", "chat", chat(response_format={"type": "yaml"}), 400, "response_format",
     "text, json_object or json_schema"),
    ("json_schema without a schema", "chat", chat(response_format={"type": "json_schema", "json_schema": {}}), 400,
     "response_format", "holding the schema under 'schema'"),
    ("a schema keyword kern cannot decode", "completions",
     comp(response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": {
         "type": "array", "uniqueItems": True}}}), 400, "response_format", 'unsupported JSON schema: Unimplemented keys: ["uniqueItems"]'),
    ("a schema with an unknown type", "chat",
     chat(response_format={"type": "json_schema", "json_schema": {"schema": {"type": "strin"}}}), 400,
     "response_format", "Invalid type: strin"),
    ("several prompts, one empty", "completions", comp(prompt=["w5", ""]), 400, "prompt", "prompt[1] is empty"),
    ("best_of", "completions", comp(best_of=2), 400, "best_of", "unsupported parameter 'best_of'"),
    ("unknown field", "chat", chat(frobnicate=1), 400, "frobnicate", "unsupported parameter 'frobnicate'"),
    ("empty prompt", "completions", comp(prompt=""), 400, "prompt", "empty after tokenizing"),
    # JSON that parses but no tokenizer takes, or that Python's parser refuses by its own limits
    ("lone surrogate in content", "chat", chat(messages=[{"role": "user", "content": "w5 \ud800"}]), 400,
     "messages[0].content", "lone surrogate ('\\ud800' at character 3)"),
    ("lone surrogate in prompt", "completions", comp(prompt="\udfff w5"), 400, "prompt", "lone surrogate"),
    ("lone surrogate in a stop string", "chat", chat(stop=["w5", "\ud800"]), 400, "stop[1]", "lone surrogate"),
    ("nested 100,000 levels deep", "chat", b'{"model": "MODEL", "stop": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
     400, None, "nests arrays or objects too deeply"),
    ("an integer of 5,000 digits", "completions", b'{"model": "MODEL", "prompt": "w5", "max_tokens": ' + b"9" * 5000
     + b"}", 400, "max_tokens", "max_tokens is an integer of 5000 digits"),
    ("NaN temperature", "chat", b'{"model": "MODEL", "messages": [{"role": "user", "content": "w5"}], '
     b'"temperature": NaN}', 400, "temperature", "temperature must be a number, got NaN"),
    ("infinite top_p", "completions", b'{"model": "MODEL", "prompt": "w5", "top_p": 1e400}', 400, "top_p",
     "top_p must be a number, got Infinity"),
]


def _named(body, model_name):
    if isinstance(body, dict) and body.get("model") == M:
        return {**body, "model": model_name}
    return body.replace(f'"{M}"'.encode(), json.dumps(model_name).encode()) if isinstance(body, bytes) else body


@pytest.mark.parametrize("case,path,body,status,param,says", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_refused_naming_the_field(server, model_name, case, path, body, status, param, says):
    code, out = post(server, f"/v1/{'chat/completions' if path == 'chat' else 'completions'}",
                     _named(body, model_name))
    assert code == status
    err = out["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error" and err["param"] == param
    assert says in err["message"]
    for foreign in ("pydantic", "Input should", "Traceback", "validation error"):
        assert foreign not in err["message"]


def test_a_missing_or_wrong_api_key_is_a_401(server, model_name):
    for key in (None, "wrong"):
        code, out = post(server, "/v1/completions", comp(model=model_name), key=key)
        assert code == 401 and out["error"]["code"] == "invalid_api_key"


def test_an_unknown_route_is_an_openai_shaped_404(server):
    code, out = post(server, "/v1/embeddings", {"model": "x", "input": "w1"})
    assert code == 404 and "no such route" in out["error"]["message"]


def test_the_server_keeps_serving_after_bad_input(server, model_name):
    for _, path, body, *_ in CASES[:5]:
        post(server, f"/v1/{'chat/completions' if path == 'chat' else 'completions'}", _named(body, model_name))
    code, out = post(server, "/v1/completions", comp(model=model_name, max_tokens=3, temperature=0))
    assert code == 200 and out["choices"][0]["finish_reason"] in ("length", "stop")
