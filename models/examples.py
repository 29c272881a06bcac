"""Regenerate the committed example deployments (like a lock file: the generator is the source).

    python -m kern_models.examples [OUT_DIR]     default: examples/ of this repository

One folder per model and target: the embedded SmolLM2-135M-Instruct for the cpu, for sm_90a
(the shipped cubins; nvcc only after a kernel source changed) and for sm_90a as one kernel (the
megakernel's decode, docs/megakernel.md). tests/test_examples.py checks they match a fresh
generation."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from kern_models.embedded import MODEL_NAME, prepare
from kern_models.llama.generator import generate

TARGETS = {"cpu": "cpu", "sm90a": "cuda", "sm90a-mega": "mega"}
SLUG = "smollm2-135m-instruct"


def write(out: Path, targets=TARGETS) -> list[Path]:
    config = json.loads((prepare(progress=False) / "config.json").read_text())
    made = []
    for suffix, target in targets.items():
        folder = out / f"{SLUG}-{suffix}"
        shutil.rmtree(folder, ignore_errors=True)
        made.append(generate(config, folder, target=target, model=MODEL_NAME))
    return made


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent / "examples"
    for path in write(out):
        print(path)


if __name__ == "__main__":
    main()
