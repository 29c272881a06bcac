"""Tools through the official openai client against the embedded model with a hermes tool
section in its template (smol.py): the tools reach the prompt through the template, calls come
back as `tool_calls` (streamed as OpenAI streams them), "required" and a named function are
decoded under the functions' schemas so the arguments always validate, and a tool's result goes
back in a `role: "tool"` message."""

from __future__ import annotations

import json

import pytest

jsonschema = pytest.importorskip("jsonschema")

from .smol import smol, smol_client, smol_name  # noqa: E402,F401  (fixtures)

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                            "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET", "PST"]}}, "required": ["zone"],
        "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "description": "The time in a time zone",
                                           "parameters": TIME}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]


def _valid(call) -> None:
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def _gathered(parts) -> tuple[str, list[dict], str]:
    """(content, calls, finish reason) of a stream, calls assembled by index as clients do."""
    content, calls = "", {}
    for p in parts:
        if not p.choices:
            continue
        d = p.choices[0].delta
        content += d.content or ""
        for c in d.tool_calls or []:
            slot = calls.setdefault(c.index, {"id": None, "name": "", "arguments": ""})
            slot["id"] = c.id or slot["id"]
            slot["name"] += (c.function.name or "") if c.function else ""
            slot["arguments"] += (c.function.arguments or "") if c.function else ""
    return content, [calls[k] for k in sorted(calls)], parts[-1].choices[0].finish_reason


def test_the_tools_reach_the_prompt_through_the_template(smol, smol_name):
    import http.client
    from urllib.parse import urlsplit

    u = urlsplit(smol.url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    conn.request("POST", "/tokenize", json.dumps({"model": smol_name, "messages": ASK, "tools": TOOLS}).encode(),
                 {"Content-Type": "application/json"})
    out = json.loads(conn.getresponse().read())
    text = smol.driver.info.tokenizer.decode(out["tokens"])
    assert '"name": "get_weather"' in text and "<tool_call>" in text and text.endswith("assistant\n")


def test_required_calls_validate_and_stream_to_the_same_calls(smol_client, smol_name):
    kw = dict(model=smol_name, messages=ASK, tools=TOOLS, tool_choice="required", temperature=0, max_tokens=64)
    out = smol_client.chat.completions.create(**kw)
    c = out.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None
    assert c.message.tool_calls and all(t.type == "function" and t.id.startswith("call_")
                                        for t in c.message.tool_calls)
    for t in c.message.tool_calls:
        _valid(t)
    content, calls, finish = _gathered(list(smol_client.chat.completions.create(stream=True, **kw)))
    assert content == "" and finish == "tool_calls"
    assert [(x["name"], x["arguments"]) for x in calls] == [(t.function.name, t.function.arguments)
                                                            for t in c.message.tool_calls]


def test_one_call_without_parallel_tool_calls(smol_client, smol_name):
    out = smol_client.chat.completions.create(model=smol_name, messages=ASK, tools=TOOLS, tool_choice="required",
                                              parallel_tool_calls=False, temperature=0.9, seed=4, max_tokens=64)
    (call,) = out.choices[0].message.tool_calls
    _valid(call)


def test_a_named_function_is_called_with_valid_arguments_streamed_as_they_come(smol_client, smol_name):
    kw = dict(model=smol_name, messages=ASK, tools=TOOLS, temperature=0, max_tokens=48,
              tool_choice={"type": "function", "function": {"name": "get_time"}})
    out = smol_client.chat.completions.create(**kw)
    (call,) = out.choices[0].message.tool_calls
    assert call.function.name == "get_time" and out.choices[0].message.content is None
    _valid(call)
    parts = list(smol_client.chat.completions.create(stream=True, **kw))
    pieces = [p.choices[0].delta.tool_calls for p in parts if p.choices and p.choices[0].delta.tool_calls]
    assert len(pieces) > 2  # the head (id, name), then the arguments a few tokens at a time
    head = pieces[0][0]
    assert head.id.startswith("call_") and head.function.name == "get_time" and head.type == "function"
    assert _gathered(parts)[1] == [{"id": head.id, "name": "get_time", "arguments": call.function.arguments}]


def test_auto_answers_and_a_tool_result_goes_back_in_a_tool_message(smol_client, smol_name):
    first = smol_client.chat.completions.create(model=smol_name, messages=ASK, tools=TOOLS, temperature=0,
                                                max_tokens=48, tool_choice="required")
    call = first.choices[0].message.tool_calls[0]
    turn = ASK + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                  {"role": "tool", "tool_call_id": call.id, "content": '{"celsius": 21, "sky": "clear"}'}]
    out = smol_client.chat.completions.create(model=smol_name, messages=turn, tools=TOOLS, temperature=0,
                                              max_tokens=24)
    c = out.choices[0]
    assert c.finish_reason in ("stop", "length", "tool_calls")
    assert (c.message.content or c.message.tool_calls)  # the model answered, in words or calls
    assert out.usage.prompt_tokens > first.usage.prompt_tokens + 20  # the call and its result were rendered
