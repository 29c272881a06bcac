"""A tiny seeded random Qwen3-MoE (8 experts, top 2 renormalized, a dense mlp_only layer between
two sparse ones; router and LM head sharpened: kern_models.qwen3_moe.random_checkpoint) and its
cpu deployments: one device, and expert parallel over 2 ranks."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import tiny_family

pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="session")
def moe_family(tmp_path_factory) -> tuple[Path, dict, Path]:
    return tiny_family("qwen3_moe", "tiny-moe", tmp_path_factory)


@pytest.fixture(scope="session")
def moe_ckpt(moe_family) -> Path:
    return moe_family[0]


@pytest.fixture(scope="session")
def moe_config(moe_family) -> dict:
    return moe_family[1]


@pytest.fixture(scope="session")
def moe_dep(moe_family) -> Path:
    """The cpu deployment folder (manifest.json + kernels/)."""
    return moe_family[2]


@pytest.fixture(scope="session")
def moe_model(moe_dep, moe_ckpt):
    from kern.api import Model

    return Model(moe_dep / "manifest.json", moe_ckpt)
