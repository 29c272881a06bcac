"""Fixtures for kern test: the SmolLM2 cpu deployment (reference A) and a tiny random one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def smollm2() -> Path:
    from kern_models.embedded import prepare

    return prepare(progress=False)


@pytest.fixture(scope="session")
def smol_a(smollm2, tmp_path_factory) -> Path:
    """The generated SmolLM2-135M cpu deployment folder."""
    from kern_models.llama.generator import generate

    out = tmp_path_factory.mktemp("smol_a")
    generate(json.loads((smollm2 / "config.json").read_text()), out, target="cpu", model="SmolLM2-135M-Instruct")
    return out
