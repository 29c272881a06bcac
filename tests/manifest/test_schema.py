"""schema/manifest-v1.schema.json is generated from the typed models and must match them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kern.manifest import json_schema as schema

COMMITTED = Path(__file__).resolve().parents[2] / "schema" / "manifest-v1.schema.json"
REGENERATE = "python -m kern.manifest.json_schema > schema/manifest-v1.schema.json"


def test_committed_schema_matches_the_code():
    assert COMMITTED.read_text() == schema.text(), f"the models changed; regenerate: {REGENERATE}"


def test_the_generator_command_prints_it():
    out = subprocess.run([sys.executable, "-m", "kern.manifest.json_schema"], capture_output=True, text=True, check=True)
    assert out.stdout == COMMITTED.read_text()


def test_a_generated_manifest_validates_against_the_schema(tiny_dict):
    jsonschema = pytest.importorskip("jsonschema")
    s = json.loads(COMMITTED.read_text())
    jsonschema.validate(tiny_dict, s)
    tiny_dict = json.loads(json.dumps(tiny_dict))
    tiny_dict["buffers"]["d_x"]["colour"] = "red"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(tiny_dict, s)
