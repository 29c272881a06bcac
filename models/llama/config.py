"""The llama family's shape, read from a Hugging Face config.json."""

from __future__ import annotations

from dataclasses import dataclass

ARCHITECTURES = ("LlamaForCausalLM", "Qwen3ForCausalLM")


class ConfigError(ValueError):
    """config.json describes something this generator does not build; names the field."""


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


def shape_of(cfg: dict) -> Shape:
    archs = cfg.get("architectures") or []
    arch = next((a for a in archs if a in ARCHITECTURES), None)
    if arch is None:
        raise ConfigError(f"config.json architectures {archs}: this generator builds {', '.join(ARCHITECTURES)}")
    missing = [k for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                           "vocab_size") if k not in cfg]
    if missing:
        raise ConfigError(f"config.json lacks {', '.join(missing)}")
    if cfg.get("attention_bias") or cfg.get("mlp_bias"):
        raise ConfigError("config.json: attention_bias / mlp_bias are not supported by this generator")
    if cfg.get("hidden_act", "silu") != "silu":
        raise ConfigError(f"config.json hidden_act {cfg.get('hidden_act')!r}: only silu is supported")
    heads = cfg["num_attention_heads"]
    rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    theta = float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    rtype = rope.get("rope_type", rope.get("type", "default"))
    extra = {}
    if rtype == "llama3":
        extra = dict(rope_factor=float(rope["factor"]), rope_low=float(rope["low_freq_factor"]),
                     rope_high=float(rope["high_freq_factor"]),
                     rope_orig_max=int(rope["original_max_position_embeddings"]))
    elif rtype not in ("default", None):
        raise ConfigError(f"config.json rope type {rtype!r}: supported are default and llama3")
    return Shape(
        arch=arch,
        hidden=cfg["hidden_size"],
        layers=cfg["num_hidden_layers"],
        heads=heads,
        kv_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
        inter=cfg["intermediate_size"],
        vocab=cfg["vocab_size"],
        eps=float(cfg.get("rms_norm_eps", 1e-6)),
        theta=theta,
        max_pos=int(cfg.get("max_position_embeddings", 4096)),
        tied=bool(cfg.get("tie_word_embeddings", False)),
        qk_norm=arch == "Qwen3ForCausalLM",
        **extra,
    )
