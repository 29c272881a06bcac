"""The Kimi-Linear generator: a Hugging Face config.json in, a deployment folder out."""

from __future__ import annotations

import shutil
from pathlib import Path, PurePosixPath

from kern_models.common import deployment
from kern_models.common.cubins import sha256_of
from kern_models.common.errors import ConfigError
from kern_models.common.generator import FamilyGenerator

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
    return deployment.write(out, m)


class _Generator(FamilyGenerator):
    name = "kimi_linear"
    architectures = ARCHITECTURES
    generate = staticmethod(generate)

    def rebuild(self, source: str, target: str) -> bytes | None:
        """This family's own module rebuilt from its source (kern kernels --rebuild); the llama
        and Qwen3-MoE modules it ships are theirs to rebuild."""
        file, src = manifest_cpu.MODULES[manifest_cpu.MODULE]
        return src.read_bytes() if target == "cpu" and PurePosixPath(source).name == file else None


GENERATOR = _Generator()
