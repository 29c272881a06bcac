"""Fixtures for the reliability promises: a tiny random llama checkpoint (64 wide, 2 layers,
256 words) that `kern run` can run on text in well under a second, and a helper that runs the
kern command in-process and returns what a user would see."""

from __future__ import annotations

import json
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from kern.cli import main


@dataclass
class Result:
    code: int
    out: str
    err: str


def kern(capsys, *argv: str) -> Result:
    """`kern argv...` in-process: its exit code (argparse's usage errors included) and output."""
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    cap = capsys.readouterr()
    return Result(code, cap.out, cap.err)


CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 256,
          "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "tie_word_embeddings": True,
          "eos_token_id": 255, "_name_or_path": "tiny"}


def write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """The safetensors layout, written by hand: an 8-byte header length, the JSON header, the bytes."""
    header, blobs, at = {}, [], 0
    for name, a in tensors.items():
        b = a.tobytes()
        header[name] = {"dtype": "BF16", "shape": list(a.shape), "data_offsets": [at, at + len(b)]}
        blobs.append(b)
        at += len(b)
    head = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + b"".join(blobs))


def make_tiny(folder: Path, seed: int = 0) -> Path:
    """Random bf16 weights in the llama layout, a config.json and a word tokenizer (token i is `wi`)."""
    from kern_models.common.random_checkpoint import word_tokenizer

    c, rng = CONFIG, np.random.default_rng(seed)
    h, inter, hd = c["hidden_size"], c["intermediate_size"], c["hidden_size"] // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    shapes = {"model.embed_tokens.weight": (c["vocab_size"], h), "model.norm.weight": (h,)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes |= {p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                   p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
                   p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
                   p + "mlp.gate_proj.weight": (inter, h), p + "mlp.up_proj.weight": (inter, h),
                   p + "mlp.down_proj.weight": (h, inter)}
    tensors = {n: (np.ones(s) if len(s) == 1 else rng.normal(0, 0.1, s)).astype(ml_dtypes.bfloat16)
               for n, s in shapes.items()}
    folder.mkdir(parents=True, exist_ok=True)
    write_safetensors(folder / "model.safetensors", tensors)
    (folder / "config.json").write_text(json.dumps(c))
    word_tokenizer(c["vocab_size"]).save(str(folder / "tokenizer.json"))
    return folder


@pytest.fixture(scope="session")
def tiny_pristine(tmp_path_factory) -> Path:
    return make_tiny(tmp_path_factory.mktemp("tiny") / "tiny")


@pytest.fixture()
def tiny(tiny_pristine, tmp_path) -> Path:
    """A private copy of the tiny checkpoint that a test may damage."""
    return Path(shutil.copytree(tiny_pristine, tmp_path / "tiny"))


@pytest.fixture(autouse=True)
def _own_cache(tmp_path_factory, monkeypatch):
    """Deployments and fetched modules go to one cache for this session, never the user's."""
    monkeypatch.setenv("KERN_CACHE", str(tmp_path_factory.getbasetemp() / "kern-cache"))
