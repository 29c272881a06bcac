"""A tiny seeded random Qwen3-MoE (8 experts, top 2 renormalized, a dense mlp_only layer between
two sparse ones; router and LM head sharpened: kern_models.qwen3_moe.random_checkpoint) and its
cpu deployments: one device, and expert parallel over 2 ranks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="session")
def moe_ckpt(tmp_path_factory) -> Path:
    from kern_models.qwen3_moe.random_checkpoint import make

    return make("tiny", tmp_path_factory.mktemp("moe") / "ckpt", max_positions=512)


@pytest.fixture(scope="session")
def moe_config(moe_ckpt) -> dict:
    return json.loads((moe_ckpt / "config.json").read_text())


@pytest.fixture(scope="session")
def moe_dep(moe_config, tmp_path_factory) -> Path:
    """The cpu deployment folder (manifest.json + kernels/)."""
    from kern_models.qwen3_moe.generator import generate

    out = tmp_path_factory.mktemp("moe_dep")
    generate(moe_config, out, target="cpu", model="tiny-moe", tokens=64, seqs=4, context=256)
    return out


@pytest.fixture(scope="session")
def moe_model(moe_dep, moe_ckpt):
    from kern.api import Model

    return Model(moe_dep / "manifest.json", moe_ckpt)
