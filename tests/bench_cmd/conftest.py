"""A tiny random llama and its cpu deployment: the harness's fixtures, loaded from its
conftest by path (a plain `import conftest` would find whichever conftest came first)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

HARNESS = Path(__file__).resolve().parents[1] / "harness"
sys.path.insert(0, str(HARNESS))  # planted.py
_spec = importlib.util.spec_from_file_location("harness_fixtures", HARNESS / "conftest.py")
_fixtures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_fixtures)
tiny_a, tiny_ckpt = _fixtures.tiny_a, _fixtures.tiny_ckpt
