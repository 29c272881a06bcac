"""The llama family's shape, read from a Hugging Face config.json."""

from __future__ import annotations

from dataclasses import dataclass

from ..common.config_fields import count_field, real_field
from ..common.errors import ConfigError

ARCHITECTURES = ("LlamaForCausalLM", "Qwen3ForCausalLM")


@dataclass(frozen=True)
class Shape:
    arch: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    vocab: int
    eps: float
    theta: float
    max_pos: int
    tied: bool
    qk_norm: bool
    # llama3 rope scaling; factor 0 means none
    rope_factor: float = 0.0
    rope_low: float = 1.0
    rope_high: float = 4.0
    rope_orig_max: int = 8192

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim


# Features of a config.json this generator's kernels do not compute; building without them
# would run but make wrong text, so each is refused naming its field.
def _unsupported(cfg: dict) -> str | None:
    if cfg.get("attention_bias") or cfg.get("mlp_bias"):
        return "attention_bias / mlp_bias are not supported by this generator"
    if cfg.get("hidden_act", "silu") != "silu":
        return f"hidden_act {cfg.get('hidden_act')!r}: only silu is supported"
    if cfg.get("use_sliding_window"):
        return f"sliding_window {cfg.get('sliding_window')!r}: sliding-window attention is not supported"
    if cfg.get("quantization_config") is not None:
        return "quantization_config: quantized checkpoints are not supported (give bf16/f16/f32 weights)"
    return None


def _rope(cfg: dict) -> tuple[float, dict]:
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if not isinstance(rope, dict):
        raise ConfigError(f"config.json rope_parameters must be an object, got {rope!r}")
    where = "rope_parameters " if cfg.get("rope_parameters") else "rope_scaling "
    theta = real_field(rope, "rope_theta", None, where) if "rope_theta" in rope else real_field(cfg, "rope_theta", 10000.0)
    rtype = rope.get("rope_type", rope.get("type", "default"))
    if rtype in ("default", None):
        return theta, {}
    if rtype != "llama3":
        raise ConfigError(f"config.json {where}rope type {rtype!r}: supported are default and llama3")
    extra = dict(rope_factor=real_field(rope, "factor", None, where), rope_low=real_field(rope, "low_freq_factor", None, where),
                 rope_high=real_field(rope, "high_freq_factor", None, where),
                 rope_orig_max=count_field(rope, "original_max_position_embeddings") if
                 "original_max_position_embeddings" in rope else None)
    if extra["rope_orig_max"] is None:
        raise ConfigError(f"config.json {where}lacks original_max_position_embeddings (llama3 rope)")
    if extra["rope_high"] <= extra["rope_low"]:
        raise ConfigError(f"config.json {where}high_freq_factor {extra['rope_high']} must exceed "
                          f"low_freq_factor {extra['rope_low']} (llama3 rope)")
    return theta, extra


def shape_of(cfg: dict, architectures: tuple[str, ...] = ARCHITECTURES) -> Shape:
    """The dense shape of a config of one of `architectures` (another family, such as
    qwen3_moe, reads its attention, norms and embeddings through this too)."""
    archs = cfg.get("architectures") or []
    if not isinstance(archs, list):
        raise ConfigError(f"config.json architectures must be a list, got {archs!r}")
    arch = next((a for a in archs if a in architectures), None)
    if arch is None:
        raise ConfigError(f"config.json architectures {archs}: this generator builds {', '.join(architectures)}")
    missing = [k for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                           "vocab_size") if cfg.get(k) is None]
    if missing:
        raise ConfigError(f"config.json lacks {', '.join(missing)}")
    if (why := _unsupported(cfg)) is not None:
        raise ConfigError(f"config.json {why}")
    hidden = count_field(cfg, "hidden_size")
    heads = count_field(cfg, "num_attention_heads")
    kv_heads = count_field(cfg, "num_key_value_heads", heads)
    if heads % kv_heads:
        raise ConfigError(f"config.json num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
    if cfg.get("head_dim") is None and hidden % heads:
        raise ConfigError(f"config.json hidden_size {hidden} is not a multiple of num_attention_heads {heads} "
                          "(and no head_dim is given)")
    head_dim = count_field(cfg, "head_dim", hidden // heads)
    if head_dim % 2:
        raise ConfigError(f"config.json head_dim {head_dim} must be even (rope rotates pairs)")
    theta, extra = _rope(cfg)
    return Shape(
        arch=arch,
        hidden=hidden,
        layers=count_field(cfg, "num_hidden_layers"),
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        inter=count_field(cfg, "intermediate_size"),
        vocab=count_field(cfg, "vocab_size"),
        eps=real_field(cfg, "rms_norm_eps", 1e-6),
        theta=theta,
        max_pos=count_field(cfg, "max_position_embeddings", 4096),
        tied=bool(cfg.get("tie_word_embeddings", False)),
        qk_norm=arch.startswith("Qwen3"),  # Qwen3 and Qwen3-MoE norm each head's q and k
        **extra,
    )
