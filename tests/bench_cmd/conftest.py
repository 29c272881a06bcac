"""A tiny random llama and its cpu deployment (the harness's fixtures, shared)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "harness"))

from conftest import tiny_a, tiny_ckpt  # noqa: E402,F401  (fixtures)
