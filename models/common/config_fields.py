"""Reading a number out of a Hugging Face config.json, the one way every family does: a field
absent (or null) takes its default or is refused by name, a field of the wrong kind is refused
by name and value (ConfigError, one line)."""

from __future__ import annotations

import math

from .errors import ConfigError


def count_field(cfg: dict, key: str, default=None) -> int:
    """A positive whole number from config.json (default when absent or null)."""
    v = cfg.get(key)
    if v is None:
        if default is None:
            raise ConfigError(f"config.json lacks {key}")
        return default
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ConfigError(f"config.json {key} must be a positive whole number, got {v!r}")
    return v


def real_field(src: dict, key: str, default: float | None = None, where: str = "") -> float:
    """A positive finite number from config.json (default when absent); `where` prefixes the
    key in a refusal (a nested object's name)."""
    v = src.get(key)
    if v is None:
        if default is None:
            raise ConfigError(f"config.json {where}lacks {key}")
        return default
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v <= 0:
        raise ConfigError(f"config.json {where}{key} must be a positive number, got {v!r}")
    return float(v)
