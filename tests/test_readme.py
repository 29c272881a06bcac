"""The README's Python example does what it shows: its streaming callback prints the text as
one run, not one piece a line."""

from __future__ import annotations

import ast
import re
from pathlib import Path

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def test_the_readmes_on_text_streams_the_pieces_as_one_text(capsys):
    (block, *_) = re.findall(r"```python\n(.*?)```", README, re.DOTALL)
    (on_text,) = [kw.value for node in ast.walk(ast.parse(block)) if isinstance(node, ast.Call)
                  for kw in node.keywords if kw.arg == "on_text"]
    callback = eval(compile(ast.Expression(on_text), "README.md", "eval"))  # noqa: S307 - our own README
    for piece in ("The", " capital", " is", " Paris"):
        callback(piece)
    assert capsys.readouterr().out == "The capital is Paris"
