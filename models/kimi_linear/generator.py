"""The Kimi-Linear generator: a Hugging Face config.json in, a deployment folder out."""

from __future__ import annotations

import json
import shutil
from pathlib import Path, PurePosixPath

from kern_models.common.cubins import sha256_of
from kern_models.common.errors import ConfigError

from .config import ARCHITECTURES, shape_of
from .manifests import cpu as manifest_cpu


def generate(config: dict, out_dir: str | Path, *, target: str = "cpu", model: str | None = None,
             context: int | None = None, **limits) -> Path:
    """Write manifest.json and kernels/ for this config into out_dir; return the manifest path."""
    shape = shape_of(config)
    for split in ("tp", "ep"):
        if limits.pop(split, 1) != 1:
            raise ConfigError(f"{split}: this generator builds Kimi-Linear on one device")
    if target != "cpu":
        raise ConfigError(f"target {target!r}: this generator builds cpu")
    model = model or config.get("_name_or_path") or ARCHITECTURES[0]
    out = Path(out_dir)
    (out / "kernels").mkdir(parents=True, exist_ok=True)
    m = manifest_cpu.build(shape, model, context=context, **limits)
    for name, (file, src) in manifest_cpu.MODULES.items():
        shutil.copyfile(src, out / "kernels" / file)
        m["modules"][name]["sha256"] = sha256_of(out / "kernels" / file)
    path = out / "manifest.json"
    path.write_text(json.dumps(m, indent=1) + "\n")
    return path


class _Generator:
    """What the engine finds through the kern.generators entry point."""

    name = "kimi_linear"
    architectures = ARCHITECTURES

    def accepts(self, config: dict) -> bool:
        return any(a in ARCHITECTURES for a in config.get("architectures") or [])

    def generate(self, config: dict, out_dir, *, target: str = "cpu", model: str | None = None,
                 context: int | None = None, **limits) -> Path:
        return generate(config, out_dir, target=target, model=model, context=context, **limits)

    def rebuild(self, source: str, target: str) -> bytes | None:
        """A module this generator writes, rebuilt from its source (kern kernels --rebuild)."""
        name = PurePosixPath(source).name
        if target == "cpu":
            return next((src.read_bytes() for file, src in manifest_cpu.MODULES.values() if file == name), None)
        return None


GENERATOR = _Generator()
