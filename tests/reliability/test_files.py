"""Files a user hands over: damaged safetensors, malformed config.json, generation_config.json,
tokenizer_config.json and tokenizer.json, configs kern cannot build. Each is one line naming the
file and the problem, exit 1 from `kern run`, no traceback, and no text generated."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest

from .conftest import kern

# ---- safetensors: the header rewritten around the same data bytes ---------------------------


def _split(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def _write(path: Path, header, data: bytes) -> None:
    head = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + data)


def header(change):
    def damage(f: Path) -> None:
        h, data = _split(f)
        _write(f, change(h), data)
    return damage


def set_byte(at: int, value: int):
    def damage(f: Path) -> None:
        raw = bytearray(f.read_bytes())
        raw[at] = value
        f.write_bytes(bytes(raw))
    return damage


def tensor(name: str, **fields):
    def change(h: dict) -> dict:
        h[name] = {**h[name], **fields}
        return h
    return header(change)


def overlap(h: dict) -> dict:
    a, b = "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight"
    lo = h[a]["data_offsets"][0]
    h[b] = {**h[b], "data_offsets": [lo, lo + h[b]["data_offsets"][1] - h[b]["data_offsets"][0]]}
    return h


def truncate(f: Path) -> None:
    f.write_bytes(f.read_bytes()[:-100])


def as_folder(f: Path) -> None:
    f.unlink()
    f.mkdir()


NORM = "model.norm.weight"
SAFETENSORS = [  # (id, damage to model.safetensors, what the message says)
    ("flipped-length-byte", set_byte(3, 0x01), "damaged or truncated safetensors file"),
    ("flipped-header-byte", set_byte(8, ord("x")), "damaged safetensors header (not JSON"),
    ("non-utf8-header-byte", set_byte(8, 0xFF), "damaged safetensors header (not UTF-8 text)"),
    ("list-header", header(lambda h: list(h)), "damaged safetensors header (a JSON list, expected an object)"),
    ("negative-offset", tensor(NORM, data_offsets=[-2, 126]), f"tensor '{NORM}': data_offsets [-2, 126] is not"),
    ("reversed-offsets", tensor(NORM, data_offsets=[128, 0]), f"tensor '{NORM}': data_offsets [128, 0] is not"),
    ("overlapping-offsets", header(overlap), "overlap in the file"),
    ("shape-disagrees", tensor(NORM, shape=[65]), f"tensor '{NORM}': shape [65] of BF16 needs 130 bytes"),
    ("shape-not-a-list", tensor(NORM, shape="64"), f"tensor '{NORM}': shape '64' is not a list"),
    ("unknown-dtype", tensor(NORM, dtype="Q4"), f"tensor '{NORM}': unknown dtype 'Q4'"),
    ("entry-not-an-object", header(lambda h: {**h, NORM: [1, 2]}), f"tensor '{NORM}': header entry is list"),
    ("truncated-data", truncate, "run past the end of the data"),
    ("shorter-than-8-bytes", lambda f: f.write_bytes(b"\x01\x02"), "not a safetensors file"),
    ("a-folder", as_folder, "cannot read it: Is a directory"),
]


@pytest.mark.parametrize("damage,says", [c[1:] for c in SAFETENSORS], ids=[c[0] for c in SAFETENSORS])
def test_damaged_safetensors(tiny, capsys, damage, says):
    damage(tiny / "model.safetensors")
    r = kern(capsys, "run", str(tiny), "--prompt", "w1 w2", "--max-tokens", "2", "--target", "cpu")
    _one_clear_line(r, tiny / "model.safetensors", says)


def test_a_tensor_in_two_shards(tiny, capsys):
    shutil.copyfile(tiny / "model.safetensors", tiny / "model-2.safetensors")
    r = kern(capsys, "run", str(tiny), "--prompt", "w1", "--max-tokens", "2", "--target", "cpu")
    _one_clear_line(r, tiny / "model.safetensors", "is also in model-2.safetensors")


# ---- the JSON files beside the weights ---------------------------------------------------------


def edit(change):
    def damage(f: Path) -> None:
        f.write_text(json.dumps(change(json.loads(f.read_text())) if f.exists() else change({})))
    return damage


def text(s: str):
    return lambda f: f.write_text(s)


def without(*keys):
    return edit(lambda c: {k: v for k, v in c.items() if k not in keys})


def with_(**fields):
    return edit(lambda c: {**c, **fields})


LLAMA3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}
WORDS = "{\"model\": {\"type\": \"NoSuchModel\"}}"
JSON_FILES = [  # (id, file, damage, flags, what the message says)
    ("config-not-json", "config.json", text("{\"hidden_size\": 64,"), (), "not valid JSON (Expecting"),
    ("config-a-list", "config.json", text("[1, 2]"), (), "expected a JSON object, got a list"),
    ("config-a-folder", "config.json", as_folder, (), "is a folder, expected a JSON file"),
    ("config-not-utf8", "config.json", lambda f: f.write_bytes(b"{\"a\": \"\xff\"}"), (), "not UTF-8 text"),
    ("zero-heads", "config.json", with_(num_attention_heads=0), (),
     "num_attention_heads must be a positive whole number, got 0"),
    ("zero-kv-heads", "config.json", with_(num_key_value_heads=0), (),
     "num_key_value_heads must be a positive whole number, got 0"),
    ("heads-not-multiple", "config.json", with_(num_key_value_heads=3), (),
     "num_attention_heads 4 is not a multiple of num_key_value_heads 3"),
    ("width-a-string", "config.json", with_(hidden_size="64"), (), "hidden_size must be a positive whole number"),
    ("no-vocab", "config.json", without("vocab_size"), (), "lacks vocab_size"),
    ("eps-nan", "config.json", text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 64,
                                                "num_hidden_layers": 2, "num_attention_heads": 4,
                                                "intermediate_size": 128, "vocab_size": 256})
                                     .replace("}", ", \"rms_norm_eps\": NaN}")), (),
     "rms_norm_eps must be a positive number, got nan"),
    ("llama3-rope-missing-field", "config.json", with_(rope_parameters=LLAMA3), (),
     "rope_parameters lacks low_freq_factor"),
    ("rope-yarn", "config.json", with_(rope_scaling={"rope_type": "yarn", "factor": 4.0}), (), "rope type 'yarn'"),
    ("gelu", "config.json", with_(hidden_act="gelu"), (), "hidden_act 'gelu': only silu"),
    ("attention-bias", "config.json", with_(attention_bias=True), (), "attention_bias / mlp_bias are not supported"),
    ("sliding-window", "config.json", with_(use_sliding_window=True, sliding_window=64), (),
     "sliding-window attention is not supported"),
    ("quantized", "config.json", with_(quantization_config={"quant_method": "gptq"}), (),
     "quantized checkpoints are not supported"),
    ("unknown-architecture", "config.json", with_(architectures=["GPT2LMHeadModel"]), (),
     "no installed generator builds architectures ['GPT2LMHeadModel']"),
    ("generation-config-not-json", "generation_config.json", text("{eos_token_id: 2}"), (), "not valid JSON"),
    ("generation-config-bad-eos", "generation_config.json", with_(eos_token_id="</s>"), (),
     "eos_token_id must be a token id or a list of token ids, got '</s>'"),
    ("config-bad-eos", "config.json", with_(eos_token_id=[1, -1]), (), "eos_token_id must be a token id"),
    ("tokenizer-config-not-json", "tokenizer_config.json", text("chat_template: x"), (), "not valid JSON"),
    ("chat-template-a-number", "tokenizer_config.json", with_(chat_template=5), ("--chat",),
     "chat_template must be a string or a list of named templates, got a int"),
    ("chat-template-broken", "tokenizer_config.json", with_(chat_template="{% for %}"), ("--chat",),
     "the chat template fails"),
    ("no-chat-template", "tokenizer_config.json", with_(bos_token="<s>"), ("--chat",), "has no chat template"),
    ("tokenizer-not-json", "tokenizer.json", text("{\"model\": "), (), "not valid JSON"),
    ("tokenizer-not-a-tokenizer", "tokenizer.json", text(WORDS), (), "not a tokenizer the tokenizers library can load"),
    ("tokenizer-missing", "tokenizer.json", lambda f: f.unlink(), (), "missing; a checkpoint folder needs its tokenizer.json"),
]


@pytest.mark.parametrize("name,damage,flags,says", [c[1:] for c in JSON_FILES], ids=[c[0] for c in JSON_FILES])
def test_malformed_json_files(tiny, capsys, name, damage, flags, says):
    damage(tiny / name)
    r = kern(capsys, "run", str(tiny), "--prompt", "w1 w2", "--max-tokens", "2", "--target", "cpu", *flags)
    _one_clear_line(r, tiny / name, says)


def test_the_tiny_checkpoint_itself_runs(tiny, capsys):
    """The cases above fail because of their damage alone."""
    r = kern(capsys, "run", str(tiny), "--prompt", "w1 w2", "--max-tokens", "2", "--target", "cpu")
    assert r.code == 0, r.err
    assert r.out.strip() and "Traceback" not in r.err


def _one_clear_line(r, place: Path, says: str) -> None:
    assert r.code == 1, (r.code, r.err)
    assert "Traceback" not in r.err
    assert r.out == "", "no text may be generated from a damaged checkpoint"
    lines = [ln for ln in r.err.splitlines() if not ln.startswith("[kern]")]
    assert len(lines) == 1, r.err
    assert lines[0].startswith("kern run: ") and str(place) in lines[0] and says in lines[0], lines[0]
