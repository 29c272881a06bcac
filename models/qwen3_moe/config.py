"""The Qwen3-MoE family's shape, read from a Hugging Face config.json: the dense llama-family
shape (attention, norms, rope, embeddings, LM head: kern_models.llama.config) plus the
mixture of experts that replaces the MLP of its sparse layers."""

from __future__ import annotations

from dataclasses import dataclass

from kern_models.common.errors import ConfigError
from kern_models.common.config_fields import count_field
from kern_models.llama.config import Shape, shape_of as dense_shape_of

ARCHITECTURES = ("Qwen3MoeForCausalLM",)


@dataclass(frozen=True)
class MoeShape:
    dense: Shape            # everything but the experts (its `inter` is the mlp_only layers' MLP width)
    experts: int            # num_experts
    top_k: int              # num_experts_per_tok
    moe_inter: int          # moe_intermediate_size: one expert's MLP width
    norm_topk: bool         # norm_topk_prob: the top-k weights renormalized to sum to one
    sparse: tuple[bool, ...]  # per layer: a MoE block (True) or the dense MLP (False)

    def __getattr__(self, name):  # the dense fields (hidden, layers, heads...) read through
        if name == "dense":  # not set yet (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self.dense, name)


def sparse_layers(layers: int, step: int, mlp_only: list[int]) -> tuple[bool, ...]:
    """transformers' rule (Qwen3MoeDecoderLayer): layer l is sparse when it is not in
    mlp_only_layers and (l + 1) is a multiple of decoder_sparse_step."""
    return tuple(l not in mlp_only and (l + 1) % step == 0 for l in range(layers))


def shape_of(cfg: dict) -> MoeShape:
    dense = dense_shape_of(cfg, ARCHITECTURES)
    # transformers 5 writes num_local_experts, the published checkpoints num_experts
    key = "num_experts" if cfg.get("num_experts") is not None else "num_local_experts"
    experts = count_field(cfg, key)
    top_k = count_field(cfg, "num_experts_per_tok")
    if top_k > experts:
        raise ConfigError(f"config.json num_experts_per_tok {top_k} exceeds {key} {experts}")
    step = count_field(cfg, "decoder_sparse_step", 1)
    mlp_only = cfg.get("mlp_only_layers") or []
    if not isinstance(mlp_only, list) or not all(isinstance(l, int) and not isinstance(l, bool) for l in mlp_only):
        raise ConfigError(f"config.json mlp_only_layers must be a list of layer numbers, got {mlp_only!r}")
    if bad := [l for l in mlp_only if not 0 <= l < dense.layers]:
        raise ConfigError(f"config.json mlp_only_layers {bad}: outside the {dense.layers} layers")
    norm = cfg.get("norm_topk_prob", False)
    if not isinstance(norm, bool):
        raise ConfigError(f"config.json norm_topk_prob must be true or false, got {norm!r}")
    return MoeShape(dense=dense, experts=experts, top_k=top_k, moe_inter=count_field(cfg, "moe_intermediate_size"),
                    norm_topk=norm, sparse=sparse_layers(dense.layers, step, mlp_only))
