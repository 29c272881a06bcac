"""What the llama family's manifests share, whatever the target: the page size and the
checkpoint's tensors as weight buffers (the pieces every family writes manifests with are
kern_models.common.manifest_parts)."""

from __future__ import annotations

from kern_models.common.manifest_parts import embed_and_head, weight

from ..config import Shape

PAGE_TOKENS = 16


def weight_buffers(s: Shape, dtype: str) -> dict:
    """Every checkpoint tensor as a weight buffer of dtype: q/k/v fused into one, gate/up into
    one, the embedding and the LM head as embed_and_head binds them."""
    def w(shape, *tensors):
        return weight(shape, *tensors, dtype=dtype)

    head = embed_and_head(s.tied, dtype)
    out = {"embed": head["embed"], "final_norm": w(["hidden"], "model.norm.weight"), "lm_head": head["lm_head"]}
    for l in range(s.layers):
        pre = f"model.layers.{l}."
        out[f"ln1.{l}"] = w(["hidden"], pre + "input_layernorm.weight")
        out[f"ln2.{l}"] = w(["hidden"], pre + "post_attention_layernorm.weight")
        out[f"qkv_w.{l}"] = w(["qkv_dim", "hidden"], *(pre + f"self_attn.{p}_proj.weight" for p in "qkv"))
        out[f"o_w.{l}"] = w(["hidden", "q_dim"], pre + "self_attn.o_proj.weight")
        out[f"gate_up_w.{l}"] = w([{"mul": [2, "inter"]}, "hidden"], pre + "mlp.gate_proj.weight",
                                  pre + "mlp.up_proj.weight")
        out[f"down_w.{l}"] = w(["hidden", "inter"], pre + "mlp.down_proj.weight")
        if s.qk_norm:
            out[f"q_norm.{l}"] = w(["head_dim"], pre + "self_attn.q_norm.weight")
            out[f"k_norm.{l}"] = w(["head_dim"], pre + "self_attn.k_norm.weight")
    return out
