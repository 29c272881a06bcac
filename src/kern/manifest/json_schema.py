"""The manifest's JSON Schema, generated from the typed models (committed as
schema/manifest-v1.schema.json; a test fails when the two disagree).

    python -m kern.manifest.json_schema > schema/manifest-v1.schema.json
"""

from __future__ import annotations

import json

from .schema import SCHEMA_VERSION, Manifest


def schema() -> dict:
    s = Manifest.model_json_schema(mode="validation")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://kern.dev/schema/manifest-v{SCHEMA_VERSION}.schema.json",
        **s,
    }


def text() -> str:
    return json.dumps(schema(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    print(text(), end="")
