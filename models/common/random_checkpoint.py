"""Seeded random-weight checkpoints in Hugging Face layout, at the shapes of real models.

GPU runs use these instead of downloading weights: same tensor names, shapes and config as the
real checkpoint, bf16 weights from transformers' own initializer under a fixed seed, and a
word-level tokenizer.json over the vocabulary (token i is the word `w{i}`). Needs
torch and transformers (test and benchmark dependencies, never the runtime's)."""

from __future__ import annotations

import math
from pathlib import Path

SHAPES = {
    "smollm2-135m": dict(arch="llama", hidden_size=576, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, intermediate_size=1536, vocab_size=49152, tie_word_embeddings=True,
                         rope_parameters={"rope_type": "default", "rope_theta": 100000.0}),
    "qwen3-0.6b": dict(arch="qwen3", hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, intermediate_size=3072, vocab_size=151936,
                       tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
    "llama-3.2-1b": dict(arch="llama", hidden_size=2048, num_hidden_layers=16, num_attention_heads=32,
                         num_key_value_heads=8, intermediate_size=8192, vocab_size=128256, tie_word_embeddings=True,
                         rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                                          "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                          "original_max_position_embeddings": 8192}),
}
# Shapes too large for the benches' default sweep (bench/decode.py runs every SHAPES entry):
# asked for by name (bench/tp.py).
LARGE = {
    "llama-3.1-8b": dict(arch="llama", hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                         num_key_value_heads=8, intermediate_size=14336, vocab_size=128256, tie_word_embeddings=False,
                         rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                          "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                          "original_max_position_embeddings": 8192}),
}


def make(name: str, folder: str | Path, *, seed: int = 0, device: str = "cpu", max_positions: int = 8192) -> Path:
    """Write a random checkpoint of shape `name` (a key of SHAPES or LARGE) into folder."""
    save(model_of(name, seed=seed, device=device, max_positions=max_positions), folder)
    return Path(folder)


def save(model, folder: str | Path) -> None:
    """A model of model_of() as a checkpoint folder, with its word tokenizer."""
    folder = Path(folder)
    model.save_pretrained(folder)
    word_tokenizer(model.config.vocab_size).save(str(folder / "tokenizer.json"))


def model_of(name: str, *, seed: int = 0, device: str = "cpu", max_positions: int = 8192):
    """The seeded random transformers model (bf16) of shape `name`, on `device`."""
    import torch
    import transformers

    spec = dict({**SHAPES, **LARGE}[name])
    arch = spec.pop("arch")
    cls, cfg_cls = ((transformers.LlamaForCausalLM, transformers.LlamaConfig) if arch == "llama"
                    else (transformers.Qwen3ForCausalLM, transformers.Qwen3Config))
    cfg = cfg_cls(**spec, max_position_embeddings=max_positions)
    torch.manual_seed(seed)
    with torch.device(device):
        model = cls(cfg)
        if arch == "qwen3":  # q/k norm weights start at one: make them matter
            with torch.no_grad():
                for layer in model.model.layers:
                    layer.self_attn.q_norm.weight.uniform_(0.5, 1.5)
                    layer.self_attn.k_norm.weight.uniform_(0.5, 1.5)
        model = model.to(torch.bfloat16)
    return model


def seeded(cls, cfg, *, seed: int, device: str, sharpen=None):
    """`cls(cfg)` under a fixed seed on `device`, sharpened (random weights make near-ties
    everywhere: a family's `sharpen` makes its choices decisive), in bf16."""
    import torch

    torch.manual_seed(seed)
    with torch.device(device):
        model = cls(cfg)
        if sharpen is not None:
            sharpen(model)
        return model.to(torch.bfloat16)


def for_width(factor: float, base: int, width: int) -> float:
    """A sharpening factor chosen at a tiny shape's width `base`, carried to `width`: what it
    scales (a projection of unit-scale inputs, whose outputs grow as sqrt(width)) is as large at
    `width` as at `base`, and it is exactly `factor` at `base` (the CI shapes' weights unchanged,
    bit for bit). Scaled by the tiny shapes' factors at a real model's width, the router's logits
    saturate and the next-token logits are ~40 wide: transformers' own bf16 and fp32 part on most
    next tokens, and no parity can be judged against that spread."""
    return factor * math.sqrt(base / width)


def word_tokenizer(vocab_size: int):
    """A tokenizer.json for a random checkpoint, so that it can be run on text (kern run,
    Model.generate): token i is the word `w{i}`, words are split on whitespace."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab_size)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tok


def reference_logits(model, ids) -> dict:
    """transformers eager's logits at every position of each row of `ids` (one forward a row),
    in the model's own dtype (bf16) and again in fp32, which the model is left in: the
    bf16-vs-fp32 spread the device parity runs judge kern by. {"ids", "bf16", "fp32"}."""
    import torch

    model.config._attn_implementation = "eager"
    x = torch.tensor(ids, device=next(model.parameters()).device)
    out = {"ids": ids}
    with torch.no_grad():
        def run():
            return torch.cat([model(x[i:i + 1]).logits[0].float().cpu() for i in range(len(ids))]).numpy()
        out["bf16"] = run()
        model.float()
        out["fp32"] = run()
    return out


def judge(spread: dict, ours: dict) -> dict:
    """kern's logits (`ours`, kern.drive.parity.compare against transformers fp32) judged by
    transformers' own bf16-vs-fp32 `spread`: within it where the mean KL is at most twice the
    spread's and the argmax agreement at most 2 points below. Judgeable only where transformers'
    bf16 follows its fp32 (at least 90% of decisive next tokens): against a chaotic random model's
    spread any candidate would pass."""
    judgeable = spread["agree_decisive"] >= 0.9
    ok = (judgeable and ours["mean_kl"] <= 2 * spread["mean_kl"] + 1e-4
          and ours["agree_decisive"] >= spread["agree_decisive"] - 0.02)
    return {"judgeable": bool(judgeable), "within_spread": bool(ok)}
