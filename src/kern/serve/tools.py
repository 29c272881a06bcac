"""Tool calls: which call format a checkpoint's chat template teaches its model, and the calls
read back out of the model's text, whole or as a stream (OpenAI's `tool_calls` deltas).

Formats recognised (docs/serve.md says which models write each), each by a mark its template
writes:
- `tagged`: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one block a call;
- `bare_json`: the message is `{"name": ..., "parameters": {...}}`, calls joined by `;`, maybe
  after `<|python_tag|>` (such templates speak of the `ipython` role);
- `listed`: `[TOOL_CALLS]` then a JSON array of `{"name": ..., "arguments": {...}}`.
tool_choice "required" and a named function are decoded under a grammar instead (formats.py),
so their text is known exactly: a JSON array of `{"name", "parameters"}`, or the arguments."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from .errors import RequestError

MARKS = {"tagged": "<tool_call>", "listed": "[TOOL_CALLS]", "bare_json": "{"}


@dataclass(frozen=True, slots=True)
class ToolPlan:
    mode: str  # "auto": the model chooses, its format parsed; "required": a JSON array; "named": the arguments
    format: str  # the template's call format (MARKS)
    parallel: bool = True  # more than one call may be returned
    name: str | None = None  # the function tool_choice names


def template_tools(tokenizer) -> str:
    """The call format of the checkpoint's chat template, or a 400 saying why tools cannot be
    rendered through it (no tool section: the tools would never reach the model)."""
    tpl = getattr(tokenizer, "chat_template", None) or ""
    if not _renders_tools(tpl):
        raise RequestError("this model's chat template has no tool section (it never reads `tools`), so the "
                           "model cannot be told of them; send tool_choice \"none\" or leave tools out",
                           param="tools", code="unsupported_parameter")
    if "<tool_call>" in tpl:
        return "tagged"
    if "[TOOL_CALLS]" in tpl:
        return "listed"
    if "ipython" in tpl or "<|python_tag|>" in tpl:
        return "bare_json"
    raise RequestError("this model's chat template renders tools, but in a call format kern does not recognise "
                       "(it reads <tool_call> blocks, bare JSON calls and [TOOL_CALLS] lists)", param="tools",
                       code="unsupported_parameter")


def _renders_tools(tpl: str) -> bool:
    from jinja2 import Environment, meta
    from jinja2.exceptions import TemplateError

    try:
        return "tools" in meta.find_undeclared_variables(Environment().parse(tpl))
    except TemplateError:
        return False


@dataclass(frozen=True, slots=True)
class Call:
    name: str
    arguments: str  # JSON text


def _call(obj, args_key: str) -> Call | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get(args_key, obj.get("arguments", obj.get("parameters", {})))
    return Call(obj["name"], args if isinstance(args, str) else json.dumps(args, ensure_ascii=False))


def _json_values(text: str) -> list | None:
    """Every JSON value in text, one after another (separated by whitespace or `;`); None if
    any part is not JSON."""
    dec, out, i = json.JSONDecoder(), [], 0
    while True:
        while i < len(text) and text[i] in " \t\r\n;":
            i += 1
        if i == len(text):
            return out
        try:
            v, i = dec.raw_decode(text, i)
        except ValueError:
            return None
        out.append(v)


def parse(text: str, plan: ToolPlan) -> tuple[str | None, list[Call]]:
    """(content, calls) of a finished message. Text that is not a well-formed call stays content:
    nothing the model said is lost."""
    if plan.mode == "named":
        return None, [Call(plan.name, text)]
    if plan.mode == "required":
        got = _json_values(text)
        calls = [_call(c, "parameters") for c in got[0]] if got and isinstance(got[0], list) else []
        return (None, calls) if calls and None not in calls else (text, [])
    calls: list[Call] = []
    content = text
    if plan.format == "tagged":
        blocks = re.findall(r"<tool_call>(.*?)(?:</tool_call>|$)", text, re.S)
        got = [_json_values(b) for b in blocks]
        if blocks and all(g and len(g) == 1 for g in got):
            calls = [_call(g[0], "arguments") for g in got]
            content = re.sub(r"<tool_call>.*?(?:</tool_call>|$)", "", text, flags=re.S)
    elif plan.format == "listed" and "[TOOL_CALLS]" in text:
        head, _, body = text.partition("[TOOL_CALLS]")
        got = _json_values(body)
        if got and isinstance(got[0], list):
            calls, content = [_call(c, "arguments") for c in got[0]], head
    elif plan.format == "bare_json":
        body = text.strip().removeprefix("<|python_tag|>")
        got = _json_values(body) if body.startswith("{") else None
        if got:
            calls, content = [_call(c, "parameters") for c in got], ""
    if not calls or None in calls:
        return text, []
    if not plan.parallel:
        calls = calls[:1]
    return (content.strip() or None), calls


@dataclass(slots=True)
class ToolStream:
    """One choice's streamed message under a tool plan: text pushed as it comes, content
    deltas out while the text cannot be a call, the calls at the end (for a named function, its
    arguments stream as they come, OpenAI's way)."""

    plan: ToolPlan
    ids: CallIds
    text: str = ""
    sent: int = 0  # characters of text sent as content
    held: bool = False  # a call's mark was seen: the rest waits for the end
    started: bool = False  # named: the call's head went out

    def push(self, piece: str) -> tuple[str, list[dict]]:
        """(content to send, tool-call deltas to send) after this piece of text."""
        self.text += piece
        if self.plan.mode == "named":
            out = [] if self.started else [delta(0, self.ids(0), Call(self.plan.name, ""))]
            self.started = True
            if piece:
                out.append({"index": 0, "function": {"arguments": piece}})
            return "", out
        if self.plan.mode == "required" or self.held:
            return "", []
        mark = MARKS[self.plan.format]
        if self.plan.format == "bare_json":  # a call is the whole message: held from its first '{'
            if self.text.lstrip().startswith(("{", "<|python_tag|>")):
                self.held = True
                return "", []
            hold = 0 if self.text.strip() else len(self.text)
        else:
            at = self.text.find(mark, self.sent)
            if at >= 0:
                out, self.sent, self.held = self.text[self.sent:at], at, True
                return out, []
            hold = next((k for k in range(min(len(mark) - 1, len(self.text)), 0, -1)
                         if mark.startswith(self.text[-k:])), 0)
        end = len(self.text) - hold
        out = self.text[self.sent:end] if end > self.sent else ""
        self.sent = max(self.sent, end)
        return out, []

    def finish(self) -> tuple[str, list[dict]]:
        """(content still to send, the calls as deltas, each whole) at the end."""
        if self.plan.mode == "named":
            return "", []
        content, calls = parse(self.text[self.sent:], self.plan)  # "required": sent is 0
        rest = self.text[self.sent:]
        self.sent = len(self.text)
        if not calls:
            return rest, []
        return content or "", [delta(i, self.ids(i), c) for i, c in enumerate(calls)]


class CallIds:
    """The ids of one choice's calls: from the response id, the choice and the call's index
    (the same response gives the same ids; no randomness of their own)."""

    def __init__(self, response_id: str, choice: int):
        self.base = f"{response_id}/{choice}/"

    def __call__(self, k: int) -> str:
        import hashlib

        return "call_" + hashlib.sha256((self.base + str(k)).encode()).hexdigest()[:24]


def delta(index: int, call_id: str, c: Call) -> dict:
    return {"index": index, "id": call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}


def message_calls(calls: list[Call], ids: CallIds) -> list[dict]:
    return [{"id": ids(i), "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for i, c in enumerate(calls)]
