"""Tool calls read out of a model's text (serve/tools.py): each recognised format, whole and as a
stream cut anywhere, and the template formats told apart by their marks."""

from __future__ import annotations

import json

import pytest

from kern.serve.errors import RequestError
from kern.serve.tools import CallIds, ToolPlan, ToolStream, parse, template_tools

TAGGED = ToolPlan("auto", "tagged")
BARE = ToolPlan("auto", "bare_json")
LISTED = ToolPlan("auto", "listed")

TAGGED_TEXT = ('Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
               '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>')


def _calls(calls) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in calls]


def test_tagged_blocks_are_calls_and_the_text_around_them_content():
    content, calls = parse(TAGGED_TEXT, TAGGED)
    assert content == "Let me look."
    assert _calls(calls) == [("get_weather", {"city": "Paris"}), ("get_time", {"zone": "CET"})]


def test_without_parallel_calls_only_the_first_is_kept():
    _, calls = parse(TAGGED_TEXT, ToolPlan("auto", "tagged", parallel=False))
    assert _calls(calls) == [("get_weather", {"city": "Paris"})]


def test_bare_json_and_listed_calls():
    text = '<|python_tag|>{"name": "get_time", "parameters": {"zone": "UTC"}}; {"name": "f", "parameters": {}}'
    content, calls = parse(text, BARE)
    assert content is None and _calls(calls) == [("get_time", {"zone": "UTC"}), ("f", {})]
    content, calls = parse('Sure. [TOOL_CALLS][{"name": "f", "arguments": {"a": 1}}]', LISTED)
    assert content == "Sure." and _calls(calls) == [("f", {"a": 1})]


@pytest.mark.parametrize("plan,text", [
    (TAGGED, "<tool_call>\n{\"name\": \"f\", \"arguments\": {oops}\n</tool_call>"),  # not JSON
    (TAGGED, "<tool_call>\n{\"arguments\": {}}\n</tool_call>"),  # no name
    (BARE, "{this is prose in braces}"),
    (LISTED, "[TOOL_CALLS] not a list"),
    (TAGGED, "Just words, no call."),
])
def test_text_that_is_no_well_formed_call_stays_content(plan, text):
    assert parse(text, plan) == (text, [])


def test_required_and_named_texts_are_known_exactly():
    text = '[{"name": "get_time", "parameters": {"zone": "PST"}}, {"name": "f", "parameters": {"x": [1]}}]'
    assert _calls(parse(text, ToolPlan("required", "tagged"))[1]) == [("get_time", {"zone": "PST"}),
                                                                       ("f", {"x": [1]})]
    assert _calls(parse('{"zone": "UTC"}', ToolPlan("named", "tagged", name="get_time"))[1]) == \
        [("get_time", {"zone": "UTC"})]


def _stream(plan: ToolPlan, pieces: list[str]) -> tuple[str, list[dict]]:
    s = ToolStream(plan, CallIds("chatcmpl-1", 0))
    content, deltas = "", []
    for p in pieces:
        c, d = s.push(p)
        content, deltas = content + c, deltas + d
    c, d = s.finish()
    return content + c, deltas + d


@pytest.mark.parametrize("cut", [1, 2, 3, 5, 7, 11])
def test_a_tagged_stream_cut_anywhere_sends_the_content_then_the_calls_whole(cut):
    pieces = [TAGGED_TEXT[i:i + cut] for i in range(0, len(TAGGED_TEXT), cut)]
    content, deltas = _stream(TAGGED, pieces)
    assert content.strip() == "Let me look."
    assert [(d["index"], d["function"]["name"], json.loads(d["function"]["arguments"])) for d in deltas] == \
        [(0, "get_weather", {"city": "Paris"}), (1, "get_time", {"zone": "CET"})]
    ids = CallIds("chatcmpl-1", 0)
    assert [d["id"] for d in deltas] == [ids(0), ids(1)] and ids(0) != ids(1)


def test_a_stream_that_only_looked_like_a_call_loses_nothing():
    text = "a <tool_ca b <tool_call> {broken"
    content, deltas = _stream(TAGGED, list(text))
    assert content == text and deltas == []


def test_a_named_function_streams_its_arguments_as_they_come():
    content, deltas = _stream(ToolPlan("named", "tagged", name="get_time"), ['{"zone"', ': "UTC"', "}"])
    assert content == ""
    assert deltas[0] == {"index": 0, "id": CallIds("chatcmpl-1", 0)(0), "type": "function",
                         "function": {"name": "get_time", "arguments": ""}}
    assert "".join(d["function"]["arguments"] for d in deltas) == '{"zone": "UTC"}'


class _Tok:
    def __init__(self, template: str):
        self.chat_template = template


@pytest.mark.parametrize("template,fmt", [
    ("{% for t in tools %}{{ t | tojson }}{% endfor %}<tool_call>", "tagged"),
    ("{% if tools %}[AVAILABLE_TOOLS]{{ tools }}[/AVAILABLE_TOOLS]{% endif %}[TOOL_CALLS]", "listed"),
    ("{% if tools %}Environment: ipython{{ tools }}{% endif %}", "bare_json"),
])
def test_the_call_format_is_read_from_the_template(template, fmt):
    assert template_tools(_Tok(template)) == fmt


@pytest.mark.parametrize("template,says", [
    ("{% for m in messages %}{{ m.content }}{% endfor %}", "no tool section"),
    ("{% if tools %}{{ tools }} call them as you like{% endif %}", "call format kern does not recognise"),
])
def test_a_template_kern_cannot_use_for_tools_is_a_400_saying_why(template, says):
    with pytest.raises(RequestError, match=says) as e:
        template_tools(_Tok(template))
    assert e.value.status == 400 and e.value.param == "tools"


def test_a_forced_call_whose_schema_cannot_be_decoded_is_a_400_naming_the_tool():
    from kern.serve.formats import tool_plan

    tok = _Tok("{% for t in tools %}{{ t | tojson }}{% endfor %}<tool_call>")
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},
             {"type": "function", "function": {"name": "g", "parameters": {"type": "array", "uniqueItems": True}}}]
    with pytest.raises(RequestError, match=r'tools\[1\]\.function\.parameters: unsupported JSON schema: '
                                           r'Unimplemented keys: \["uniqueItems"\]') as e:
        tool_plan({"tools": tools, "tool_choice": "required"}, tok)
    assert e.value.status == 400 and e.value.param == "tools"
    plan, rendered, grammar = tool_plan({"tools": tools}, tok)  # "auto" decodes freely: g's schema is not used
    assert plan.mode == "auto" and rendered == tools and grammar is None
    plan, _, grammar = tool_plan({"tools": tools, "tool_choice": {"type": "function", "function": {"name": "f"}}}, tok)
    assert plan.name == "f" and grammar is not None
