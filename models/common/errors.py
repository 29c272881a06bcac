"""The one error a generator raises for input it cannot build."""

from __future__ import annotations


class ConfigError(ValueError):
    """config.json (or a generator option) describes something a generator does not build;
    names the field."""
