"""The Kimi-Linear family's shape, read from a Hugging Face config.json (KimiLinearForCausalLM).

A layer mixes tokens with either KDA (Kimi Delta Attention: a short causal convolution, then a
gated delta rule recurrence with per-channel decay, one state a head) or MLA (multi-head
latent attention over a cached compressed latent plus a shared key part; Kimi-Linear applies
no rope to it), and then either a dense MLP or a mixture of experts (sigmoid router with a
score bias for selection, routed scaling, shared experts)."""

from __future__ import annotations

from dataclasses import dataclass

from kern_models.common.errors import ConfigError
from kern_models.common.config_fields import count_field, real_field

ARCHITECTURES = ("KimiLinearForCausalLM",)
KDA, MLA = "linear_attention", "full_attention"


@dataclass(frozen=True)
class KimiShape:
    """No `tied`: tie_word_embeddings is not read, as transformers' KimiLinearForCausalLM ties
    nothing whatever it says (manifests/common.py binds the head)."""

    hidden: int
    layers: int
    vocab: int
    eps: float
    max_pos: int
    inter: int                  # the dense layers' MLP width
    mixers: tuple[str, ...]     # per layer: KDA or MLA
    sparse: tuple[bool, ...]    # per layer: a MoE block (True) or the dense MLP
    # KDA
    kda_heads: int
    kda_dim: int                # head_dim of q, k and v alike
    conv: int                   # the short convolution's window
    # MLA
    heads: int
    q_lora: int | None          # None: q_proj straight from the hidden state
    kv_lora: int
    nope: int
    rope: int
    v_dim: int
    # MoE
    experts: int
    top_k: int
    moe_inter: int
    shared: int                 # shared experts (their MLP is shared * moe_inter wide)
    scaling: float              # routed_scaling_factor
    norm_topk: bool
    groups: int                 # expert groups (n_group) and how many a token may pick from
    topk_groups: int

    @property
    def kda_layers(self) -> list[int]:
        return [l for l, m in enumerate(self.mixers) if m == KDA]

    @property
    def mla_layers(self) -> list[int]:
        return [l for l, m in enumerate(self.mixers) if m == MLA]

    @property
    def qkv(self) -> int:
        """The width of each of q, k and v in a KDA layer."""
        return self.kda_heads * self.kda_dim


def _first(cfg: dict, *keys):
    """The first of `keys` that config.json sets (transformers renames some on save)."""
    return next((k for k in keys if cfg.get(k) is not None), keys[0])


def _types(cfg: dict, layers: int, lin: dict) -> tuple[tuple[str, ...], tuple[bool, ...]]:
    """transformers' precedence: layer_types, else the checkpoint's 1-indexed kda_layers /
    full_attn_layers, else full attention every 4th layer from layer 4; mlp_layer_types, else
    dense below first_k_dense_replace."""
    mixers = cfg.get("layer_types")
    if mixers is None and "kda_layers" in lin and "full_attn_layers" in lin:
        mixers = [None] * layers
        for key, kind in (("full_attn_layers", MLA), ("kda_layers", KDA)):
            for l in lin[key]:
                if not isinstance(l, int) or not 1 <= l <= layers:
                    raise ConfigError(f"config.json linear_attn_config.{key}: {l!r} is not a layer in 1..{layers}")
                mixers[l - 1] = kind
    if mixers is None:
        mixers = [MLA if l and l % 4 == 0 else KDA for l in range(layers)]
    if not isinstance(mixers, list) or len(mixers) != layers or any(m not in (KDA, MLA) for m in mixers):
        raise ConfigError(f"config.json layer_types must give each of the {layers} layers {KDA!r} or {MLA!r}, "
                          f"got {mixers!r}")
    mlp = cfg.get("mlp_layer_types")
    if mlp is None:
        dense = cfg.get("first_k_dense_replace", 1)
        mlp = ["dense" if l < dense else "sparse" for l in range(layers)]
    if not isinstance(mlp, list) or len(mlp) != layers or any(m not in ("dense", "sparse") for m in mlp):
        raise ConfigError(f"config.json mlp_layer_types must give each of the {layers} layers 'dense' or 'sparse', "
                          f"got {mlp!r}")
    return tuple(mixers), tuple(m == "sparse" for m in mlp)


def shape_of(cfg: dict) -> KimiShape:
    archs = cfg.get("architectures") or []
    if not isinstance(archs, list) or not any(a in ARCHITECTURES for a in archs):
        raise ConfigError(f"config.json architectures {archs}: this generator builds {', '.join(ARCHITECTURES)}")
    if cfg.get("hidden_act", "silu") != "silu":
        raise ConfigError(f"config.json hidden_act {cfg.get('hidden_act')!r}: only silu is supported")
    if cfg.get("attention_bias"):
        raise ConfigError("config.json attention_bias: not supported by this generator")
    if cfg.get("quantization_config") is not None:
        raise ConfigError("config.json quantization_config: quantized checkpoints are not supported "
                          "(give bf16/f16/f32 weights)")
    if cfg.get("moe_router_activation_func", "sigmoid") != "sigmoid":
        raise ConfigError(f"config.json moe_router_activation_func {cfg['moe_router_activation_func']!r}: only "
                          "sigmoid is supported")
    lin = cfg.get("linear_attn_config") or {}
    if not isinstance(lin, dict):
        raise ConfigError(f"config.json linear_attn_config must be an object, got {lin!r}")
    layers = count_field(cfg, "num_hidden_layers")
    mixers, sparse = _types(cfg, layers, lin)
    heads = count_field(cfg, "num_attention_heads")
    kv_heads = count_field(cfg, "num_key_value_heads", heads)
    if kv_heads != heads:
        # MLA expands its latent into every head; transformers' repeat_kv on top of that only
        # works when the two counts agree
        raise ConfigError(f"config.json num_key_value_heads {kv_heads} must equal num_attention_heads {heads} (MLA)")
    experts = count_field(cfg, _first(cfg, "num_experts", "num_local_experts"))
    top_k = count_field(cfg, _first(cfg, "num_experts_per_token", "num_experts_per_tok"))
    groups = count_field(cfg, _first(cfg, "num_expert_group", "n_group"), 1)
    topk_groups = count_field(cfg, "topk_group", 1)
    if top_k > experts or experts % groups or topk_groups > groups:
        raise ConfigError(f"config.json experts {experts}, top k {top_k}, groups {groups}, topk_group "
                          f"{topk_groups}: top k must not exceed the experts, which split evenly into groups, "
                          "and topk_group must not exceed the groups")
    norm = cfg.get(_first(cfg, "moe_renormalize", "norm_topk_prob"), True)
    if not isinstance(norm, bool):
        raise ConfigError(f"config.json moe_renormalize must be true or false, got {norm!r}")
    q_lora = cfg.get("q_lora_rank")
    return KimiShape(
        hidden=count_field(cfg, "hidden_size"), layers=layers, vocab=count_field(cfg, "vocab_size"),
        eps=real_field(cfg, "rms_norm_eps", 1e-5), max_pos=count_field(cfg, _first(cfg, "model_max_length",
                                                                         "max_position_embeddings"), 4096),
        inter=count_field(cfg, "intermediate_size"),
        mixers=mixers, sparse=sparse,
        kda_heads=count_field(lin, "num_heads", None) if "num_heads" in lin else count_field(cfg, "linear_num_heads", 32),
        kda_dim=count_field(lin, "head_dim", None) if "head_dim" in lin else count_field(cfg, "linear_head_dim", 128),
        conv=count_field(lin, "short_conv_kernel_size") if "short_conv_kernel_size" in lin
        else count_field(cfg, "linear_conv_kernel_dim", 4),
        heads=heads, q_lora=None if q_lora is None else count_field(cfg, "q_lora_rank"),
        kv_lora=count_field(cfg, "kv_lora_rank"), nope=count_field(cfg, "qk_nope_head_dim"),
        rope=count_field(cfg, "qk_rope_head_dim"), v_dim=count_field(cfg, "v_head_dim"),
        experts=experts, top_k=top_k, moe_inter=count_field(cfg, "moe_intermediate_size"),
        shared=count_field(cfg, _first(cfg, "num_shared_experts", "n_shared_experts"), 1),
        scaling=real_field(cfg, "routed_scaling_factor", 1.0), norm_topk=norm, groups=groups, topk_groups=topk_groups,
    )
