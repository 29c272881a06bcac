"""Seeded random-weight Qwen3-MoE checkpoints in Hugging Face layout (per-expert tensors, as the
published checkpoints have them), at a real model's shape or a tiny one for CI.

Random weights route nearly uniformly (router logits of std ~0.02 over 128 experts make every
top-k a near-tie), so a reference and a candidate would disagree on experts over noise of
the last bit; `sharpen` scales the router (and the LM head, and the q/k norms) so routing and
next tokens are decisive, as a trained model's are, and the experts' outputs so a wrong expert
shows. Needs torch and transformers (test and
benchmark dependencies, never the runtime's)."""

from __future__ import annotations

import math
from pathlib import Path

from kern_models.common.random_checkpoint import word_tokenizer

SHAPES = {
    # Qwen3-30B-A3B (num_hidden_layers 48 in the published config; `layers` picks the depth)
    "qwen3-30b-a3b": dict(hidden_size=2048, num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4,
                          head_dim=128, intermediate_size=6144, moe_intermediate_size=768, num_experts=128,
                          num_experts_per_tok=8, norm_topk_prob=True, vocab_size=151936, tie_word_embeddings=False,
                          rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
    # the GPU tests': the smallest the sm_90a kernels take (head_dim 64, widths multiples of 32)
    "small": dict(hidden_size=256, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                  intermediate_size=256, moe_intermediate_size=64, num_experts=16, num_experts_per_tok=4,
                  norm_topk_prob=True, mlp_only_layers=[1], vocab_size=512, tie_word_embeddings=False,
                  rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
    # CI's: every feature of the family (a dense mlp_only layer, renormalized top-k) in a few ms a step
    "tiny": dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 intermediate_size=96, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
                 norm_topk_prob=True, mlp_only_layers=[1], vocab_size=256, tie_word_embeddings=False,
                 rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
}
# The router and the experts are scaled for the width: at hidden 64 and expert width 32 (the tiny
# shape) by ROUTER_SCALE and EXPERT_SCALE, elsewhere so that the router logits' std (~3.2) and each
# expert's output are what they are there. Scaled by the same factors at the Qwen3-30B-A3B width
# (router logits of std ~18, experts' outputs ~2 a layer), 24 layers are chaotic: transformers' own
# bf16 and fp32 agreed on 3% of next tokens (mean KL 96, the H200 on 2026-12-01), so no candidate
# could be judged against them; at the widths' factors they agree on ~98% (the CPU, 24 layers of
# that width with 16 experts).
ROUTER_SCALE = 20.0  # router logits of std 0.02 x 20 x sqrt(64) ~ 3.2: decisive top-k choices
HEAD_SCALE = 40.0    # next-token logits with margins far above fp32-vs-fp32 noise
EXPERT_SCALE = 8.0   # the experts' outputs as large as the residual stream they add to (at the
                     # initializer's 0.02 they would be a few percent of it: a wrong expert would hide)


def model_of(name: str, *, seed: int = 0, device: str = "cpu", layers: int | None = None,
             max_positions: int = 4096, **overrides):
    """The seeded random transformers Qwen3MoeForCausalLM (bf16) of shape `name`, sharpened."""
    import torch
    import transformers

    spec = {**SHAPES[name], **overrides}
    if layers is not None:
        spec["num_hidden_layers"] = layers
    cfg = transformers.Qwen3MoeConfig(**spec, max_position_embeddings=max_positions)
    torch.manual_seed(seed)
    with torch.device(device):
        model = transformers.Qwen3MoeForCausalLM(cfg)
        sharpen(model)
        return model.to(torch.bfloat16)


def sharpen(model) -> None:
    import torch

    cfg = model.config
    router = ROUTER_SCALE * math.sqrt(64 / cfg.hidden_size)  # exactly the scales at the tiny shape's width
    expert = EXPERT_SCALE * math.sqrt(32 / cfg.moe_intermediate_size)
    with torch.no_grad():
        model.lm_head.weight.mul_(HEAD_SCALE)
        for layer in model.model.layers:
            layer.self_attn.q_norm.weight.uniform_(0.5, 1.5)  # q/k norm weights start at one: make them matter
            layer.self_attn.k_norm.weight.uniform_(0.5, 1.5)
            if hasattr(layer.mlp, "gate"):  # drawn here: not every transformers release initialises it
                layer.mlp.gate.weight.normal_(0.0, model.config.initializer_range * router)
                for name, p in layer.mlp.experts.named_parameters():
                    if "down" in name:
                        p.mul_(expert)


def make(name: str, folder: str | Path, **kw) -> Path:
    """Write the random checkpoint of shape `name` (with its word tokenizer) into folder."""
    model = model_of(name, **kw)
    folder = Path(folder)
    model.save_pretrained(folder)
    word_tokenizer(model.config.vocab_size).save(str(folder / "tokenizer.json"))
    return folder
