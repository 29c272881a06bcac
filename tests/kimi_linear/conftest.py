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


@pytest.fixture(scope="module")
def gpu(tmp_path_factory):
    """The Kimi-Linear cubins loaded on GPU 0 through tests/cuda's harness (the kernel-level GPU
    tests' device; their modules carry the `gpu` mark and skip without one)."""
    from tests.cuda.cuda_gpu import Gpu
    from kern_models.kimi_linear.kernels.cuda import CUBINS

    g = Gpu.of_family(CUBINS, tmp_path_factory.mktemp("kimi_cubins"))
    yield g
    g.close()


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


@pytest.fixture(scope="session")
def kimi_chunked(kimi_family, tmp_path_factory) -> Stepped:
    """The same model's cpu deployment with the prompt's recurrence in 16-row chunks
    (kda_form="chunked", sm_90a's form) instead of the default's token at a time."""
    from kern_models.kimi_linear.generator import generate

    ckpt, config, _ = kimi_family
    dep = tmp_path_factory.mktemp("kimi_chunked")
    generate(config, dep, target="cpu", model="tiny-kimi", tokens=64, seqs=4, context=256, kda_form="chunked")
    return Stepped(dep / "manifest.json", ckpt)
