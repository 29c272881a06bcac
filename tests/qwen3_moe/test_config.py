"""What the Qwen3-MoE generator reads from a config.json, and each config it refuses, in one line
naming the field; the router kernel's choices (softmax over every expert, top k, ties to the
lowest expert index, optional renormalization)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from kern_models.qwen3_moe.config import ConfigError, shape_of, sparse_layers
from kern_models.qwen3_moe.random_checkpoint import SHAPES

BASE = {"architectures": ["Qwen3MoeForCausalLM"], **SHAPES["tiny"], "max_position_embeddings": 512}


def test_the_published_shape_reads_as_qwen3_30b_a3b():
    s = shape_of({"architectures": ["Qwen3MoeForCausalLM"], **SHAPES["qwen3-30b-a3b"], "decoder_sparse_step": 1,
                  "mlp_only_layers": []})
    assert (s.experts, s.top_k, s.moe_inter, s.norm_topk, s.hidden, s.heads, s.kv_heads) == \
        (128, 8, 768, True, 2048, 32, 4)
    assert all(s.sparse) and len(s.sparse) == 48 and s.dense.qk_norm


def test_transformers_5_names_num_experts_num_local_experts():
    cfg = {k: v for k, v in BASE.items() if k != "num_experts"} | {"num_local_experts": 8}
    assert shape_of(cfg).experts == 8


@pytest.mark.parametrize("layers,step,mlp_only", [(6, 1, []), (6, 2, []), (6, 3, [2]), (5, 1, [0, 4])])
def test_sparse_layers_follow_transformers(layers, step, mlp_only):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.Qwen3MoeConfig(**{**SHAPES["tiny"], "num_hidden_layers": layers, "decoder_sparse_step": step,
                                         "mlp_only_layers": mlp_only})
    model = transformers.Qwen3MoeForCausalLM(cfg)
    theirs = tuple(hasattr(layer.mlp, "experts") for layer in model.model.layers)
    assert sparse_layers(layers, step, mlp_only) == theirs


@pytest.mark.parametrize("change,message", [
    ({"num_experts_per_tok": 9}, "config.json num_experts_per_tok 9 exceeds num_experts 8"),
    ({"num_experts": 0}, "config.json num_experts must be a positive whole number, got 0"),
    ({"moe_intermediate_size": None}, "config.json lacks moe_intermediate_size"),
    ({"decoder_sparse_step": -1}, "config.json decoder_sparse_step must be a positive whole number, got -1"),
    ({"mlp_only_layers": [3]}, "config.json mlp_only_layers [3]: outside the 3 layers"),
    ({"mlp_only_layers": "1"}, "config.json mlp_only_layers must be a list of layer numbers, got '1'"),
    ({"norm_topk_prob": "yes"}, "config.json norm_topk_prob must be true or false, got 'yes'"),
    ({"architectures": ["Qwen3ForCausalLM"]},
     "config.json architectures ['Qwen3ForCausalLM']: this generator builds Qwen3MoeForCausalLM"),
    ({"hidden_act": "gelu"}, "config.json hidden_act 'gelu': only silu is supported"),
])
def test_a_config_it_cannot_build_is_one_line_naming_the_field(change, message):
    with pytest.raises(ConfigError) as e:
        shape_of({**BASE, **change})
    assert str(e.value) == message


def _kernels():
    path = Path(__file__).parents[2] / "models" / "qwen3_moe" / "kernels" / "cpu" / "kernels.py"
    spec = importlib.util.spec_from_file_location("moe_cpu_kernels", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("norm", [0, 1])
def test_route_takes_the_top_k_and_breaks_ties_to_the_lowest_expert(norm):
    logits = np.array([[0.0, 2.0, 2.0, 1.0, 2.0],   # a three-way tie for first: experts 1 and 2
                       [5.0, 1.0, 1.0, 1.0, 1.0]],  # one winner, a four-way tie for second: expert 1
                      np.float32)
    ids, w = np.zeros((2, 2), np.int32), np.zeros((2, 2), np.float32)
    _kernels().route(logits.copy(), ids, w, norm)
    assert ids.tolist() == [[1, 2], [0, 1]]
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    want = np.take_along_axis(p, ids, 1)
    if norm:
        want /= want.sum(1, keepdims=True)
    np.testing.assert_allclose(w, want, rtol=1e-6)


def test_experts_compute_only_the_experts_they_hold():
    """experts(first=2, count=2) fills the (row, choice) pairs routed to experts 2 and 3 and
    leaves zeros where another rank's experts were chosen."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 8)).astype(np.float32)
    gate_up, down = rng.normal(size=(2 * 2 * 4, 8)).astype(np.float32), rng.normal(size=(2 * 8, 4)).astype(np.float32)
    ids = np.array([[2, 0], [1, 3], [3, 2]], np.int32)
    y = np.full((3, 2, 8), np.nan, np.float32)
    _kernels().experts(x, ids, gate_up, down, y, 2, 2)
    owned = (ids >= 2)
    assert np.all(y[~owned] == 0) and np.all(np.isfinite(y[owned])) and np.all(y[owned] != 0)
    g, u = x[0] @ gate_up[:4].T, x[0] @ gate_up[4:8].T  # row 0's choice 0: expert 2, the first held
    np.testing.assert_allclose(y[0, 0], (g / (1 + np.exp(-g)) * u) @ down[:8].T, rtol=1e-5)
