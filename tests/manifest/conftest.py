"""A small valid manifest, made by the llama generator, that the tests break one way at a time."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from kern.manifest.verify import verify_text

TINY = dict(architectures=["LlamaForCausalLM"], hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, intermediate_size=128, vocab_size=256, max_position_embeddings=512)


def tiny_manifest(tmp: Path, **config) -> dict:
    from kern_models.llama.generator import generate

    return json.loads(generate({**TINY, **config}, tmp).read_text())


@pytest.fixture(scope="session")
def tiny_dict(tmp_path_factory) -> dict:
    return tiny_manifest(tmp_path_factory.mktemp("tiny"))


@pytest.fixture
def m(tiny_dict) -> dict:
    """A fresh copy of the tiny manifest to break."""
    return copy.deepcopy(tiny_dict)


def problems(d: dict | str | bytes) -> list:
    """Every problem verify reports for a manifest dict (or raw text)."""
    text = d if isinstance(d, (str, bytes)) else json.dumps(d)
    return verify_text(text).problems


def where_what(d) -> list[tuple[str, str]]:
    return [(p.where, p.what) for p in problems(d)]
