"""A tiny random llama (no tokenizer: token ids in, token ids out) and loops over it."""

from __future__ import annotations

from dataclasses import replace

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from kern.api import Model, deployment_for  # noqa: E402
from kern.generation.limits import HEADROOM  # noqa: E402
from kern.generation.loop import Loop  # noqa: E402
from tests.runtime.conftest import tiny_checkpoint  # noqa: E402


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory):
    ckpt = tiny_checkpoint(tmp_path_factory.mktemp("llama"), "llama")
    return ckpt, deployment_for(ckpt, "cpu")


def make_loop(tiny_llama, *, budget: int = 256, max_seqs: int = 32, state_budget: int = 64 << 20,
              host_bytes: int = 0, headroom: int | None = HEADROOM) -> Loop:
    """A fresh model and pool; a loop over it with these limits (no eos: requests run to length)."""
    ckpt, manifest = tiny_llama
    model = Model(manifest, ckpt, state_budget=state_budget, host_bytes=host_bytes, max_seqs=max_seqs)
    loop = model.loop
    loop.limits = replace(loop.limits, budget=budget, headroom=headroom)
    return loop


def _gpu_unavailable() -> str | None:
    try:
        from kern.runtime.devices.cuda.driver import open_device

        open_device(0)
    except Exception as e:  # noqa: BLE001 - any failure means: skip, saying why
        return f"no usable CUDA GPU: {e}"
    return None


def pytest_runtest_setup(item):
    if item.get_closest_marker("gpu") is not None and (why := _gpu_unavailable()):
        pytest.skip(why)
