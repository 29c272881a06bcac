"""The Qwen3-MoE cpu reference against transformers eager: the runtime's parity tests
(tests/runtime/test_parity.py: teacher-forced KL and argmax agreement, chunked prefill, several
sequences in one prefill) run on the tiny MoE as on the dense family (its `tiny` fixture); here,
tighter bounds, and the layers' experts bound by name."""

from __future__ import annotations

import numpy as np

from kern.drive.parity import compare, teacher_forced
from tests.runtime.conftest import reference_logits


def test_teacher_forced_logits_match_transformers_fp32_tightly(moe_model, moe_ckpt):
    """fp32 against fp32 from the same weights, the router sharpened: every decisive position
    agrees and the KL is at the level of summation order."""
    ids = np.random.default_rng(1).integers(0, 256, 96).tolist()
    r = compare(reference_logits(moe_ckpt, ids), teacher_forced(moe_model, ids))
    assert r["decisive"] >= 80, r
    assert r["mean_kl"] <= 1e-6 and r["max_kl"] <= 1e-4, r
    assert r["agree_decisive"] == 1.0, r


def test_the_dense_layer_keeps_its_mlp_and_the_sparse_layers_their_experts(moe_dep):
    """mlp_only_layers [1]: layer 1 reads its dense gate/up/down, layers 0 and 2 a router and experts."""
    import json

    m = json.loads((moe_dep / "manifest.json").read_text())
    assert {"gate_up_w.1", "down_w.1", "router_w.0", "router_w.2", "experts_gate_up.2"} <= set(m["buffers"])
    assert not {"gate_up_w.0", "router_w.1", "experts_down.1"} & set(m["buffers"])
    binds = [s["tensor"] for s in m["buffers"]["experts_gate_up.0"]["bind"]]
    assert binds[:3] == ["model.layers.0.mlp.experts.0.gate_proj.weight", "model.layers.0.mlp.experts.0.up_proj.weight",
                         "model.layers.0.mlp.experts.1.gate_proj.weight"] and len(binds) == 16
