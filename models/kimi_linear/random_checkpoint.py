"""Seeded random-weight Kimi-Linear checkpoints in the published layout (the original
KimiLinearForCausalLM tensor names: block_sparse_moe.experts.{e}.w1/w2/w3, q/k/v_conv1d, the
dense layers' mlp.*), at the real model's shape or a tiny one for CI.

Random weights make near-ties everywhere; `sharpen` makes routing, norms and next tokens
decisive, as a trained model's are: the router scaled and given a score bias that matters, the
norm weights spread around one, the LM head scaled. Needs torch and transformers (test and
benchmark dependencies, never the runtime's)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from kern_models.common.random_checkpoint import for_width, seeded, word_tokenizer

_TOKENS = dict(pad_token_id=None, bos_token_id=1, eos_token_id=2)
SHAPES = {
    # Kimi-Linear-48B-A3B (27 layers, MLA at 4, 8, .., 24 and 27 counted from 1; `layers` cuts the depth)
    "kimi-linear-48b-a3b": dict(
        hidden_size=2304, intermediate_size=9216, moe_intermediate_size=1024, num_hidden_layers=27,
        num_attention_heads=32, num_key_value_heads=32, kv_lora_rank=512, q_lora_rank=None, qk_rope_head_dim=64,
        qk_nope_head_dim=128, v_head_dim=128, num_local_experts=256, num_experts_per_tok=8, n_shared_experts=1,
        routed_scaling_factor=2.446, linear_head_dim=128, linear_num_heads=32, vocab_size=163840,
        tie_word_embeddings=False, rms_norm_eps=1e-5,
        layer_types=["full_attention" if l in (3, 7, 11, 15, 19, 23, 26) else "linear_attention" for l in range(27)],
        mlp_layer_types=["dense"] + ["sparse"] * 26),
    # the GPU tests': small, but every projection's K past one unit of the gemv's k order and the
    # dense layer's down projection (K 2048) through all 8 of its partials, KDA heads of 64
    "small": dict(
        hidden_size=512, intermediate_size=2048, moe_intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=128, q_lora_rank=None, qk_rope_head_dim=32,
        qk_nope_head_dim=32, v_head_dim=64, num_local_experts=16, num_experts_per_tok=4, n_shared_experts=1,
        n_group=4, topk_group=2, routed_scaling_factor=2.446, linear_head_dim=64, linear_num_heads=4,
        vocab_size=512, tie_word_embeddings=False,
        layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention"],
        mlp_layer_types=["dense", "sparse", "sparse", "sparse"]),
    # CI's: every feature (KDA and MLA layers, a dense MLP and MoE layers, grouped routing) in a few ms a step
    "tiny": dict(
        hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=None, qk_rope_head_dim=16, qk_nope_head_dim=16,
        v_head_dim=16, num_local_experts=8, num_experts_per_tok=2, n_shared_experts=1, n_group=2, topk_group=1,
        routed_scaling_factor=2.446, linear_head_dim=16, linear_num_heads=4, vocab_size=256,
        tie_word_embeddings=False, layer_types=["linear_attention", "full_attention", "linear_attention",
                                                "linear_attention"],
        mlp_layer_types=["dense", "sparse", "sparse", "sparse"]),
}
# The router, the experts and the LM head are scaled for the width (common.random_checkpoint.
# for_width), so their outputs are as large as at the tiny shape, where the factors below apply
# unchanged. Past that, at any width but the tiny shape's (whose weights CI pins), the experts'
# outputs are calmed further: at the real width a layer's bf16 rounding otherwise grows through
# the MoE layers until transformers' own bf16 and fp32 disagree too often to judge kern by. How
# 0.4 was chosen, with the measurements: docs/hybrid.md, "The random checkpoint's calm experts".
EXPERT_CALM = 0.4
ROUTER_SCALE = 20.0  # decisive top-k choices
BIAS_STD = 0.05      # the score bias moves some choices (sigmoid scores differ by ~0.1 at the top)
HEAD_SCALE = 40.0    # next-token logits with margins far above fp32-vs-fp32 noise


def shape_config(name: str, layers: int | None = None, **overrides) -> dict:
    """The transformers KimiLinearConfig arguments of shape `name`, at `layers` depth (the real
    shape cut keeps its pattern of KDA and MLA layers, cut at the end)."""
    spec = {**SHAPES[name], **_TOKENS, **overrides}
    if layers is not None:
        spec["num_hidden_layers"] = layers
        spec["layer_types"], spec["mlp_layer_types"] = spec["layer_types"][:layers], spec["mlp_layer_types"][:layers]
    return spec


def model_of(name: str, *, seed: int = 0, device: str = "cpu", layers: int | None = None,
             max_positions: int = 4096, **overrides):
    """The seeded random transformers KimiLinearForCausalLM (bf16) of shape `name`, sharpened."""
    import transformers

    cfg = transformers.KimiLinearConfig(**shape_config(name, layers, **overrides),
                                        max_position_embeddings=max_positions)
    return seeded(transformers.KimiLinearForCausalLM, cfg, seed=seed, device=device, sharpen=sharpen)


def factors(cfg) -> tuple[float, float, float]:
    """The router's, the experts' (their down projections') and the LM head's factors at cfg's width."""
    calm = 1.0 if cfg.hidden_size == SHAPES["tiny"]["hidden_size"] else EXPERT_CALM
    return (for_width(ROUTER_SCALE, 64, cfg.hidden_size), for_width(1.0, 32, cfg.moe_intermediate_size) * calm,
            for_width(HEAD_SCALE, 64, cfg.hidden_size))


def sharpen(model) -> None:
    import torch

    router, expert, head = factors(model.config)
    with torch.no_grad():
        model.lm_head.weight.mul_(head)
        for layer in model.model.layers:
            at = layer.self_attn
            for norm in ("kv_a_layernorm", "q_a_layernorm", "o_norm"):
                if getattr(at, norm, None) is not None:
                    getattr(at, norm).weight.uniform_(0.5, 1.5)  # they start at one: make them matter
            if hasattr(layer.mlp, "gate"):
                layer.mlp.gate.weight.mul_(router)
                layer.mlp.gate.e_score_correction_bias.normal_(0, BIAS_STD)
                downs = [p for mlp in (layer.mlp.experts, layer.mlp.shared_experts)
                         for name, p in mlp.named_parameters() if "down" in name]
                assert len(downs) == 2, "transformers renamed the experts' down projections"
                for p in downs:
                    p.mul_(expert)


def make(name: str, folder: str | Path, **kw) -> Path:
    """Write the random checkpoint of shape `name` (with its word tokenizer) into folder."""
    return save(model_of(name, **kw), folder)


def save(model, folder: str | Path) -> Path:
    """A model of model_of() as a checkpoint folder in the published layout, with its word tokenizer."""
    folder = Path(folder)
    model.save_pretrained(folder)
    _publish_dense_names(folder)
    _publish_config(folder)
    word_tokenizer(model.config.vocab_size).save(str(folder / "tokenizer.json"))
    return folder


def _publish_config(folder: Path) -> None:
    """config.json also says what the published Kimi-Linear config says in its own fields, which
    other readers take instead of transformers' (vLLM's KimiLinearConfig reads no layer_types:
    without linear_attn_config every layer is MLA there, without first_k_dense_replace layer 0 is
    MoE, and its MLA refuses to run without mla_use_nope). transformers and kern read both and
    the two agree."""
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    mixers, mlps = cfg["layer_types"], cfg["mlp_layer_types"]
    dense = next((i for i, m in enumerate(mlps) if m != "dense"), len(mlps))
    assert all(m == "sparse" for m in mlps[dense:]), "the published config has dense MLPs first, then MoE"
    cfg.update(
        linear_attn_config={"kda_layers": [l + 1 for l, m in enumerate(mixers) if m == "linear_attention"],
                            "full_attn_layers": [l + 1 for l, m in enumerate(mixers) if m == "full_attention"],
                            "head_dim": cfg["linear_head_dim"], "num_heads": cfg["linear_num_heads"],
                            "short_conv_kernel_size": cfg["linear_conv_kernel_dim"]},
        mla_use_nope=True, first_k_dense_replace=dense, moe_layer_freq=1, use_grouped_topk=True,
        moe_router_activation_func="sigmoid")
    path.write_text(json.dumps(cfg, indent=2) + "\n")


_DENSE = re.compile(r"\.block_sparse_moe\.(?=(gate|up|down)_proj\.)")


def _publish_dense_names(folder: Path) -> None:
    """transformers saves every layer's MLP under block_sparse_moe.; the published checkpoint
    keeps the dense layers' under mlp. (transformers reads both)."""
    from safetensors.torch import load_file, save_file

    name = lambda k: _DENSE.sub(".mlp.", k)
    for f in sorted(folder.glob("*.safetensors")):
        tensors = load_file(f)
        if any(name(k) != k for k in tensors):
            save_file({name(k): t for k, t in tensors.items()}, f, metadata={"format": "pt"})
    index = folder / "model.safetensors.index.json"
    if index.exists():
        data = json.loads(index.read_text())
        data["weight_map"] = {name(k): v for k, v in data["weight_map"].items()}
        index.write_text(json.dumps(data, indent=2))
