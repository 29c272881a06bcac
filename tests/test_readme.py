"""The README's Python example does what it shows: its streaming callback prints the text as
one run, not one piece a line, and every call it makes names a function of the API with
arguments that function takes (a renamed keyword or a moved function fails here, not in a
reader's hands)."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()
(BLOCK, *_) = re.findall(r"```python\n(.*?)```", README, re.DOTALL)


def dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and (base := dotted(node.value)):
        return f"{base}.{node.attr}"
    return None


def api() -> dict[str, object]:
    """What each name the README calls is, by the variable the README binds it to."""
    import kern
    from kern.api import Model
    from kern.generation import SamplingParams
    from kern.mega import MegaModel

    return {"kern.load": kern.api.load, "model.generate": Model.generate,
            "model.generate_batch": Model.generate_batch, "model.close": Model.close, "SamplingParams": SamplingParams,
            "kern.MegaModel.from_pretrained": MegaModel.from_pretrained, "mega.generate": MegaModel.generate,
            "print": print}


def test_the_readmes_on_text_streams_the_pieces_as_one_text(capsys):
    (on_text,) = [kw.value for node in ast.walk(ast.parse(BLOCK)) if isinstance(node, ast.Call)
                  for kw in node.keywords if kw.arg == "on_text"]
    callback = eval(compile(ast.Expression(on_text), "README.md", "eval"))  # noqa: S307 - our own README
    for piece in ("The", " capital", " is", " Paris"):
        callback(piece)
    assert capsys.readouterr().out == "The capital is Paris"


def test_every_call_in_the_readme_binds_to_the_api():
    known = api()
    calls = [n for n in ast.walk(ast.parse(BLOCK)) if isinstance(n, ast.Call) and dotted(n.func)]
    assert len(calls) >= 6
    for call in calls:
        name = dotted(call.func)
        assert name in known, f"README calls {name}, which this test does not know: add it"
        if name == "print":
            continue
        fn = known[name]
        sig = inspect.signature(fn)
        bound_self = () if inspect.isclass(fn) or name.startswith("kern.") else (None,)
        args = bound_self + tuple(None for _ in call.args)
        sig.bind(*args, **{kw.arg: None for kw in call.keywords})  # a TypeError names the bad keyword


def test_the_check_catches_a_renamed_keyword():
    from kern.mega import MegaModel

    with pytest.raises(TypeError):
        inspect.signature(MegaModel.generate).bind(None, None, max_tokens_renamed=1)
