"""The Llama-3.2-1B shape's sm_90a deployment (generated on the CPU: pinned cubins, no GPU),
at the generator's default limits and at small ones that make a host's batch split."""

from __future__ import annotations

import json

import pytest

LLAMA_1B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048,
            "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
            "intermediate_size": 8192, "max_position_embeddings": 131072, "rope_theta": 500000.0,
            "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                             "original_max_position_embeddings": 8192, "rope_type": "llama3"},
            "rms_norm_eps": 1e-5, "vocab_size": 128256, "tie_word_embeddings": True}


def _verified(path):
    from kern.manifest.verify import load_verified

    return load_verified(path)


@pytest.fixture(scope="session")
def deployment_1b(tmp_path_factory):
    from kern_models.llama.generator import generate

    return generate(LLAMA_1B, tmp_path_factory.mktemp("llama1b"), target="sm_90a", model="llama-1b",
                    context=4096)


@pytest.fixture(scope="session")
def verified_1b(deployment_1b):
    return _verified(deployment_1b)


@pytest.fixture(scope="session")
def small_limits(tmp_path_factory):
    """The same model whose ragged program steps at most 4 sequences and 64 rows a call."""
    from kern_models.llama.generator import generate

    return _verified(generate(LLAMA_1B, tmp_path_factory.mktemp("llama1b_small"), target="sm_90a", model="llama-1b",
                              context=1024, tokens=64, prefill_seqs=4))


@pytest.fixture
def manifest_1b(deployment_1b) -> dict:
    return json.loads(deployment_1b.read_text())
