"""A tiny seeded random Kimi-Linear (KDA layers 0, 2, 3 and an MLA layer 1; a dense MLP at layer 0,
MoE with grouped sigmoid routing, a score bias and a shared expert after; router, norms and LM
head sharpened: kern_models.kimi_linear.random_checkpoint) and its cpu deployment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="session")
def kimi_ckpt(tmp_path_factory) -> Path:
    from kern_models.kimi_linear.random_checkpoint import make

    return make("tiny", tmp_path_factory.mktemp("kimi") / "ckpt", max_positions=512)


@pytest.fixture(scope="session")
def kimi_config(kimi_ckpt) -> dict:
    return json.loads((kimi_ckpt / "config.json").read_text())


@pytest.fixture(scope="session")
def kimi_dep(kimi_config, tmp_path_factory) -> Path:
    """The cpu deployment folder (manifest.json + kernels/)."""
    from kern_models.kimi_linear.generator import generate

    out = tmp_path_factory.mktemp("kimi_dep")
    generate(kimi_config, out, target="cpu", model="tiny-kimi", tokens=64, seqs=4, context=256)
    return out


class Stepped:
    """What kern.drive steps by hand: the deployment's engine with its pool (kern.api.Model
    refuses the hybrid until the host loop fills the `slot` role)."""

    def __init__(self, manifest: Path, ckpt: Path):
        from kern.manifest import load_verified
        from kern.runtime.engine import Engine

        self.engine = Engine(load_verified(manifest), ckpt, paged=True)
        self.paging, self.protocol = self.engine.paging, self.engine.protocol
        self.page_tokens = self.paging.page_tokens


@pytest.fixture(scope="session")
def kimi_model(kimi_dep, kimi_ckpt) -> Stepped:
    return Stepped(kimi_dep / "manifest.json", kimi_ckpt)
