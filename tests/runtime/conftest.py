"""Fixtures for the runtime tests: tiny seeded checkpoints in Hugging Face layout, and the
embedded model, each with a generated cpu deployment."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from kern.api import Model, deployment_for  # noqa: E402


def tiny_checkpoint(folder: Path, arch: str, seed: int = 0) -> Path:
    if arch == "qwen3_moe":  # the second family: 8 experts, top 2, a dense layer between sparse ones
        from kern_models.qwen3_moe.random_checkpoint import make

        return make("tiny", folder, seed=seed, max_positions=512)
    torch.manual_seed(seed)
    common = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=128, vocab_size=256, max_position_embeddings=512)
    if arch == "llama":
        cfg = transformers.LlamaConfig(**common, tie_word_embeddings=False, rope_parameters={
            "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
        model = transformers.LlamaForCausalLM(cfg)
    else:
        cfg = transformers.Qwen3Config(**common, head_dim=32, tie_word_embeddings=True,
                                       rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
        model = transformers.Qwen3ForCausalLM(cfg)
        # q/k norm weights start at one: make them matter
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.q_norm.weight.uniform_(0.5, 1.5)
                layer.self_attn.k_norm.weight.uniform_(0.5, 1.5)
    model.to(torch.bfloat16).save_pretrained(folder)
    return folder


@pytest.fixture(scope="session", params=["llama", "qwen3", "qwen3_moe"])
def tiny(request, tmp_path_factory) -> tuple[Path, Path]:
    """(checkpoint folder, manifest path) of a tiny random model."""
    ckpt = tiny_checkpoint(tmp_path_factory.mktemp(request.param), request.param)
    return ckpt, deployment_for(ckpt, "cpu")


@pytest.fixture(scope="session")
def smollm2() -> Path:
    from kern_models.embedded import prepare

    return prepare(progress=False)


@pytest.fixture(scope="session")
def smollm2_model(smollm2) -> Model:
    return Model(deployment_for(smollm2, "cpu"), smollm2)


def reference_logits(ckpt: Path, ids: list[int]) -> np.ndarray:
    """transformers eager in fp32, from the same bf16 weights: logits of every position."""
    ref = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32,
                                                            attn_implementation="eager").eval()
    with torch.no_grad():
        return ref(torch.tensor([ids])).logits[0].numpy()
