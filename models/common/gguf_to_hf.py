"""Convert a llama-architecture GGUF file (byte-level BPE vocabulary) into a Hugging Face checkpoint.

The folder it writes is what `LlamaForCausalLM.from_pretrained` and `AutoTokenizer.from_pretrained`
read: config.json, generation_config.json, model.safetensors (bf16, HF tensor names),
tokenizer.json and tokenizer_config.json. Everything comes from the GGUF file itself:

- weights are dequantized with `gguf.quants.dequantize` and rounded to bf16;
- q_proj / k_proj rows get llama.cpp's rope permutation undone (convert_hf_to_gguf.py reorders
  each head's rows from HF's rotate-half layout [x0..x(d/2-1), y0..y(d/2-1)] to the interleaved
  pairs [x0, y0, x1, y1, ...] that ggml's rope kernel wants);
- the tokenizer is rebuilt from `tokenizer.ggml.tokens` / `merges` / `token_type`, with the split
  rules llama.cpp names in `tokenizer.ggml.pre`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
from tqdm import tqdm

# GGUF tensor name -> HF tensor name (llama). `{i}` is the layer.
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
}
_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(.+)")

# llama.cpp token types (gguf.TokenType): 3 is CONTROL (special), 4 is USER_DEFINED (added, not special).
_CONTROL, _USER_DEFINED = 3, 4

# `tokenizer.ggml.pre` -> how text is split before BPE, as llama.cpp's llama-vocab.cpp does it.
# "smollm" isolates every digit (\p{N}), then applies the GPT-2 split: exactly the Hugging Face
# tokenizer.json of SmolLM / SmolLM2 (Digits(individual_digits) + ByteLevel).
_PRE_TOKENIZERS = {
    "gpt-2": lambda: pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    "smollm": lambda: pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    ),
}


class GGUFConversionError(ValueError):
    """The GGUF file describes something this converter does not handle; the message says what."""


@dataclass(frozen=True, slots=True)
class LlamaShape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    context: int
    rope_theta: float
    rms_eps: float
    tied: bool


def convert(gguf_path: Path, out_dir: Path, *, progress: bool = True) -> None:
    """Write the Hugging Face checkpoint of `gguf_path` into the (existing, empty) `out_dir`."""
    reader = GGUFReader(gguf_path)
    meta = _metadata(reader)
    shape = _llama_shape(reader, meta)
    tensors = _hf_tensor_plan(reader, shape)
    _write_json(out_dir / "config.json", _config(shape, meta))
    _write_json(out_dir / "generation_config.json", _generation_config(meta))
    tokenizer = _tokenizer(meta)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    _write_json(out_dir / "tokenizer_config.json", _tokenizer_config(meta, shape))
    _write_safetensors(out_dir / "model.safetensors", tensors, progress=progress)


def unpermute_rope_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo convert_hf_to_gguf.py's `permute`: per head, rows [x0, y0, x1, y1, ...] -> [x..., y...].

    llama.cpp does `w.reshape(n_head, 2, d // 2, cols).swapaxes(1, 2)`; this is its inverse.
    """
    rows = w.shape[0]
    if rows % (2 * n_head):
        raise GGUFConversionError(f"{rows} rows do not split into {n_head} heads of an even size")
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# --- metadata ----------------------------------------------------------------------------------


def _metadata(reader: GGUFReader) -> dict:
    return {name: field.contents() for name, field in reader.fields.items()}


def _require(meta: dict, key: str):
    if key not in meta:
        raise GGUFConversionError(f"GGUF metadata has no {key!r}")
    return meta[key]


def _f32(value: float) -> float:
    """The shortest decimal that is the same float32 (GGUF stores 1e-5 as 9.999999747378752e-06)."""
    return float(str(np.float32(value)))


def _llama_shape(reader: GGUFReader, meta: dict) -> LlamaShape:
    arch = _require(meta, "general.architecture")
    if arch != "llama":
        raise GGUFConversionError(f"architecture {arch!r} is not handled; only 'llama' is")
    hidden = int(_require(meta, "llama.embedding_length"))
    heads = int(_require(meta, "llama.attention.head_count"))
    names = {t.name for t in reader.tensors}
    return LlamaShape(
        hidden=hidden,
        layers=int(_require(meta, "llama.block_count")),
        heads=heads,
        kv_heads=int(meta.get("llama.attention.head_count_kv", heads)),
        head_dim=int(meta.get("llama.rope.dimension_count", hidden // heads)),
        intermediate=int(_require(meta, "llama.feed_forward_length")),
        vocab=int(meta.get("llama.vocab_size", len(_require(meta, "tokenizer.ggml.tokens")))),
        context=int(_require(meta, "llama.context_length")),
        rope_theta=_f32(meta.get("llama.rope.freq_base", 10000.0)),
        rms_eps=_f32(_require(meta, "llama.attention.layer_norm_rms_epsilon")),
        tied="output.weight" not in names,
    )


def _config(s: LlamaShape, meta: dict) -> dict:
    return {
        "_name_or_path": meta.get("general.name") or "llama",
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": s.hidden,
        "num_hidden_layers": s.layers,
        "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads,
        "head_dim": s.head_dim,
        "intermediate_size": s.intermediate,
        "hidden_act": "silu",
        "max_position_embeddings": s.context,
        "rope_theta": s.rope_theta,
        "rope_scaling": None,
        "rms_norm_eps": s.rms_eps,
        "vocab_size": s.vocab,
        "tie_word_embeddings": s.tied,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": meta.get("tokenizer.ggml.padding_token_id"),
        "torch_dtype": "bfloat16",
        "use_cache": True,
    }


def _generation_config(meta: dict) -> dict:
    return {
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": meta.get("tokenizer.ggml.padding_token_id"),
    }


# --- tokenizer ---------------------------------------------------------------------------------


def _tokenizer(meta: dict) -> Tokenizer:
    kind = _require(meta, "tokenizer.ggml.model")
    if kind != "gpt2":
        raise GGUFConversionError(f"tokenizer.ggml.model {kind!r} is not handled; only byte-level BPE 'gpt2' is")
    pre = meta.get("tokenizer.ggml.pre", "gpt-2")
    if pre not in _PRE_TOKENIZERS:
        raise GGUFConversionError(
            f"tokenizer.ggml.pre {pre!r} has no split rule here; known: {sorted(_PRE_TOKENIZERS)}"
        )
    tokens = list(_require(meta, "tokenizer.ggml.tokens"))
    types = list(meta.get("tokenizer.ggml.token_type", [1] * len(tokens)))
    merges = []
    for merge in _require(meta, "tokenizer.ggml.merges"):
        pair = tuple(merge.split(" "))
        if len(pair) != 2:
            raise GGUFConversionError(f"merge {merge!r} is not two tokens separated by one space")
        merges.append(pair)
    bpe = models.BPE(
        vocab={token: i for i, token in enumerate(tokens)},
        merges=merges,
        fuse_unk=False,
        byte_fallback=False,
    )
    tokenizer = Tokenizer(bpe)
    tokenizer.pre_tokenizer = _PRE_TOKENIZERS[pre]()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, types) if k == _CONTROL]
    )
    tokenizer.add_tokens(
        [AddedToken(t, special=False, normalized=False) for t, k in zip(tokens, types) if k == _USER_DEFINED]
    )
    return tokenizer


def _tokenizer_config(meta: dict, s: LlamaShape) -> dict:
    tokens = meta["tokenizer.ggml.tokens"]

    def token(key: str) -> str | None:
        index = meta.get(f"tokenizer.ggml.{key}")
        return None if index is None else tokens[index]

    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": token("bos_token_id"),
        "eos_token": token("eos_token_id"),
        "pad_token": token("padding_token_id"),
        "unk_token": token("unknown_token_id"),
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token", False)),
        "add_prefix_space": bool(meta.get("tokenizer.ggml.add_space_prefix", False)),
        "clean_up_tokenization_spaces": False,
        "model_max_length": s.context,
    }
    if "tokenizer.chat_template" in meta:
        config["chat_template"] = meta["tokenizer.chat_template"]
    return config


# --- weights -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Tensor:
    hf_name: str
    shape: tuple[int, ...]  # HF (row-major) shape
    source: object  # gguf ReaderTensor
    rope_heads: int  # > 0: undo the rope row permutation with this many heads


def _hf_name(gguf_name: str, layers: int) -> str:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    match = _LAYER_TENSOR.fullmatch(gguf_name)
    if match and int(match[1]) < layers and match[2] in _LAYER_NAMES:
        return f"model.layers.{match[1]}.{_LAYER_NAMES[match[2]]}"
    raise GGUFConversionError(f"GGUF tensor {gguf_name!r} has no Hugging Face llama counterpart")


def _hf_tensor_plan(reader: GGUFReader, s: LlamaShape) -> list[_Tensor]:
    plan = []
    for t in reader.tensors:
        name = _hf_name(t.name, s.layers)
        heads = s.heads if name.endswith("q_proj.weight") else s.kv_heads if name.endswith("k_proj.weight") else 0
        # GGUF lists dimensions fastest-first (ggml ne[]); numpy and HF list them slowest-first.
        plan.append(_Tensor(name, tuple(int(d) for d in reversed(t.shape)), t, heads))
    expected = 2 + (0 if s.tied else 1) + s.layers * len(_LAYER_NAMES)
    if len(plan) != expected:
        raise GGUFConversionError(f"expected {expected} tensors for {s.layers} llama layers, found {len(plan)}")
    return sorted(plan, key=lambda t: _natural_key(t.hf_name))


def _natural_key(name: str) -> list:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def _bf16(t: _Tensor) -> np.ndarray:
    values = dequantize(t.source.data, t.source.tensor_type).reshape(t.shape)
    if t.rope_heads:
        values = unpermute_rope_rows(values, t.rope_heads)
    return np.ascontiguousarray(values.astype(ml_dtypes.bfloat16))


def _write_safetensors(path: Path, tensors: list[_Tensor], *, progress: bool) -> None:
    """Stream a safetensors file: the header (offsets come from the shapes), then one tensor at a time."""
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for t in tensors:
        size = 2 * int(np.prod(t.shape))
        header[t.hf_name] = {"dtype": "BF16", "shape": list(t.shape), "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(len(blob).to_bytes(8, "little"))
        f.write(blob)
        for t in tqdm(tensors, desc="convert", unit="tensor", disable=not progress):
            f.write(_bf16(t).tobytes())


def _write_json(path: Path, value: dict) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n")
