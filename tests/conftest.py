"""Every test marked `gpu` skips, saying why, where no CUDA GPU is usable (CI has none); a tiny
random llama (its cpu deployment and a checkpoint) for the tools' tests (kern test, bench, cut)."""

from __future__ import annotations

import importlib
import json
from functools import cache
from pathlib import Path

import pytest


@cache
def gpu_unavailable() -> str | None:
    """None when a CUDA GPU is usable, else why not."""
    try:
        from kern.runtime.devices.cuda.driver import open_device

        open_device(0)
    except Exception as e:  # noqa: BLE001 - any failure means: skip, saying why
        return f"no usable CUDA GPU: {e}"
    return None


def pytest_runtest_setup(item):
    if item.get_closest_marker("gpu") is not None and (why := gpu_unavailable()):
        pytest.skip(why)


TINY_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
               "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
               "intermediate_size": 128, "max_position_embeddings": 512, "rope_theta": 10000.0,
               "rms_norm_eps": 1e-5, "vocab_size": 256, "tie_word_embeddings": False}


@pytest.fixture(scope="session")
def tiny_a(tmp_path_factory) -> Path:
    """A tiny llama deployment (no weights needed: for the diff)."""
    from kern_models.llama.generator import generate

    out = tmp_path_factory.mktemp("tiny_a")
    generate(TINY_CONFIG, out, target="cpu", model="tiny", tokens=32, seqs=4, context=256)
    return out


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory) -> Path:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(**{k: v for k, v in TINY_CONFIG.items() if k not in ("architectures", "model_type")})
    folder = tmp_path_factory.mktemp("tiny_ckpt")
    model = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():  # random logits are near-ties everywhere: make the model decisive
        model.lm_head.weight.mul_(40.0)
    model.to(torch.bfloat16).save_pretrained(folder)
    return folder


def tiny_family(family: str, model: str, tmp_path_factory) -> tuple[Path, dict, Path]:
    """A family's tiny seeded random checkpoint (its random_checkpoint's "tiny" shape), its
    config and its cpu deployment: what each new family's tests start from."""
    make = importlib.import_module(f"kern_models.{family}.random_checkpoint").make
    generate = importlib.import_module(f"kern_models.{family}.generator").generate
    ckpt = make("tiny", tmp_path_factory.mktemp(family) / "ckpt", max_positions=512)
    config = json.loads((ckpt / "config.json").read_text())
    dep = tmp_path_factory.mktemp(f"{family}_dep")
    generate(config, dep, target="cpu", model=model, tokens=64, seqs=4, context=256)
    return ckpt, config, dep
