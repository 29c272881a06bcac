"""The engine names no model, no buffer and no program (docs/architecture.md, "Layers").

All model knowledge lives in models/ (kern_models); src/kern reads roles from the manifest.
Two checks: no model family is named in src/kern's code (comments excluded), and no string
literal in src/kern equals a buffer or program name of the examples' generated manifests."""

from __future__ import annotations

import ast
import io
import json
import re
import tokenize
from pathlib import Path

import pytest

ENGINE = Path(__file__).resolve().parents[1] / "src" / "kern"
# a family name begins a word (qwen3_moe, kimi_linear and Qwen3ForCausalLM are hits too)
FAMILIES = re.compile(r"\b(llama|tinyllama|qwen|smollm|mistral|deepseek|kimi)", re.IGNORECASE)
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, vocab_size=256, max_position_embeddings=512)


def engine_files() -> list[Path]:
    files = sorted(ENGINE.rglob("*.py"))
    assert len(files) > 10, f"found only {len(files)} files under {ENGINE}"
    return files


def docstring_lines(source: str) -> set[int]:
    """First lines of the module's, classes' and functions' docstrings (prose, like comments)."""
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                out.add(first.lineno)
    return out


def code_without_comments(path: Path) -> list[tuple[int, str]]:
    """(line, token text) of every token but comments and docstrings."""
    source = path.read_text()
    prose = docstring_lines(source)
    toks = tokenize.generate_tokens(io.StringIO(source).readline)
    return [(t.start[0], t.string) for t in toks
            if t.type != tokenize.COMMENT and not (t.type == tokenize.STRING and t.start[0] in prose)]


def test_the_engine_names_no_model_family():
    hits = [f"{f.relative_to(ENGINE.parent)}:{line}: {text.strip()[:80]}"
            for f in engine_files() for line, text in code_without_comments(f) if FAMILIES.search(text)]
    assert not hits, "model families named in the engine (move it to models/):\n" + "\n".join(hits)


@pytest.fixture(scope="module")
def example_names(tmp_path_factory) -> set[str]:
    """Buffer and program names of generated manifests (llama, and qwen3 with its q/k norms)."""
    from kern_models.llama.generator import generate

    names: set[str] = set()
    for arch in ("LlamaForCausalLM", "Qwen3ForCausalLM"):
        m = json.loads(generate({**TINY, "architectures": [arch]}, tmp_path_factory.mktemp(arch)).read_text())
        names |= set(m["buffers"]) | set(m["programs"])
    assert {"prefill", "decode", "rope_init", "d_qkv", "ln1.0", "lm_head"} <= names
    return names


def string_literals(path: Path):
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value


def test_the_engine_names_no_buffer_or_program(example_names):
    hits = [f"{f.relative_to(ENGINE.parent)}:{line}: {value!r}"
            for f in engine_files() for line, value in string_literals(f) if value in example_names]
    assert not hits, ("buffer or program names in the engine (read roles from the manifest instead):\n"
                      + "\n".join(hits))


def test_the_checks_catch_what_they_look_for(tmp_path):
    """The greps are not vacuous: a planted name is found."""
    planted = tmp_path / "planted.py"
    planted.write_text('"""A docstring may say SmolLM2."""\n'
                       'x = "decode"  # fine: a comment may say Llama\ny = "Llama"\n'
                       'z = "kimi_linear"\nq = "Qwen3MoeForCausalLM"\n')
    assert [v for _, v in string_literals(planted)][1:] == ["decode", "Llama", "kimi_linear", "Qwen3MoeForCausalLM"]
    assert [t for _, t in code_without_comments(planted) if FAMILIES.search(t)] == [
        '"Llama"', '"kimi_linear"', '"Qwen3MoeForCausalLM"']
