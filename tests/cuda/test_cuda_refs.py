"""The numpy references the GPU tests use agree bit for bit with transformers (CPU, no GPU):
so kernel == reference (on the GPU) chains to kernel == transformers."""

import numpy as np
import pytest

from tests.cuda import cuda_refs as R

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from transformers import LlamaConfig  # noqa: E402
from transformers.models.llama import modeling_llama as ml  # noqa: E402

LLAMA3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def rotary(head_dim, params):
    cfg = LlamaConfig(hidden_size=head_dim * 8, num_attention_heads=8, num_key_value_heads=2,
                      head_dim=head_dim, max_position_embeddings=131072, rope_parameters=params)
    return ml.LlamaRotaryEmbedding(cfg)


@pytest.mark.parametrize("head_dim,params", [
    (64, LLAMA3), (128, LLAMA3), (64, {"rope_type": "default", "rope_theta": 100000.0}),
    (128, {"rope_type": "default", "rope_theta": 1000000.0})])
def test_rope_table_reference_matches_transformers(head_dim, params):
    emb = rotary(head_dim, params)
    p = params
    inv = R.inv_freq(head_dim, p["rope_theta"], p.get("factor", 0.0), p.get("low_freq_factor", 1.0),
                     p.get("high_freq_factor", 4.0), p.get("original_max_position_embeddings", 8192))
    # The kernel (and this reference) round theta^(2i/d) correctly; torch's CPU pow is at
    # most 1 ulp off on some entries (seen: theta 1e6, d 128, i 37). Everything else is exact.
    hf = emb.inv_freq.numpy()
    assert np.abs(hf.view(np.int32) - inv.view(np.int32)).max() <= 1
    cos, sin = emb(torch.zeros(1, 3000, head_dim, dtype=torch.bfloat16), torch.arange(3000)[None])
    table = R.rope_table(3000, head_dim, inv)
    half = head_dim // 2
    for theirs, ours in ((cos[0].float().numpy()[:, :half], table[:, :half]),
                         (sin[0].float().numpy()[:, half:], table[:, half:])):
        assert R.ulp_diff(theirs, ours).max() <= 1
        assert np.mean(theirs == R.rbf(ours)) > 0.999


def test_rope_reference_matches_apply_rotary_pos_emb():
    rng = np.random.default_rng(0)
    emb = rotary(64, LLAMA3)
    pos = rng.integers(0, 3000, size=5)
    q = R.rand_bf16(rng, (5, 4, 64))
    cos, sin = emb(torch.zeros(1, 5, 64, dtype=torch.bfloat16), torch.tensor(pos)[None])
    qt = torch.tensor(R.f32(q)).to(torch.bfloat16).transpose(0, 1)[None]  # [1, heads, seq, dim]
    ref, _ = ml.apply_rotary_pos_emb(qt, qt, cos, sin)
    table = R.rope_table(3000, 64, emb.inv_freq.numpy())
    ours = R.rope_heads(R.f32(q), pos, table)
    assert np.array_equal(ref[0].transpose(0, 1).float().numpy(), ours)


def test_rms_norm_reference_matches_llama_rms_norm():
    rng = np.random.default_rng(1)
    x, w = R.rand_bf16(rng, (6, 576)), R.rand_bf16(rng, (576,))
    norm = ml.LlamaRMSNorm(576, eps=1e-5)
    norm.weight.data = torch.tensor(R.f32(w)).to(torch.bfloat16)
    with torch.no_grad():
        ref = norm(torch.tensor(R.f32(x)).to(torch.bfloat16)).float().numpy()
    assert R.ulp_diff(ref, R.rms_norm(x, w, 1e-5)).max() <= 1
    assert np.mean(ref == R.rms_norm(x, w, 1e-5)) > 0.99
