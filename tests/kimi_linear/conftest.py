"""A tiny seeded random Kimi-Linear (KDA layers 0, 2, 3 and an MLA layer 1; a dense MLP at layer 0,
MoE with grouped sigmoid routing, a score bias and a shared expert after; router, norms and LM
head sharpened: kern_models.kimi_linear.random_checkpoint) and its cpu deployment."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import tiny_family

pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="session")
def kimi_family(tmp_path_factory) -> tuple[Path, dict, Path]:
    return tiny_family("kimi_linear", "tiny-kimi", tmp_path_factory)


@pytest.fixture(scope="session")
def kimi_ckpt(kimi_family) -> Path:
    return kimi_family[0]


@pytest.fixture(scope="session")
def kimi_config(kimi_family) -> dict:
    return kimi_family[1]


@pytest.fixture(scope="session")
def kimi_dep(kimi_family) -> Path:
    """The cpu deployment folder (manifest.json + kernels/)."""
    return kimi_family[2]


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
