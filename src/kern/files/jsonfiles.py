"""The JSON files of a checkpoint folder (config.json, generation_config.json,
tokenizer_config.json, tokenizer.json), read so that a damaged one is one KernError naming the
file and what is wrong with it."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import KernError


def read_object(path: Path) -> dict:
    """The JSON object in `path`; KernError when it cannot be read, is not JSON or not an object."""
    try:
        text = path.read_bytes().decode("utf-8")
    except IsADirectoryError:
        raise KernError(f"{path}: is a folder, expected a JSON file") from None
    except OSError as exc:
        raise KernError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise KernError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise KernError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    if not isinstance(value, dict):
        raise KernError(f"{path}: expected a JSON object, got a {type(value).__name__}")
    return value


def token_ids(path: Path, data: dict, key: str) -> list[int]:
    """`data[key]` as a list of token ids (a missing key or null is none): one id or a list of them."""
    v = data.get(key)
    if v is None:
        return []
    ids = v if isinstance(v, list) else [v]
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise KernError(f"{path}: {key} must be a token id or a list of token ids, got {v!r}")
    return ids
