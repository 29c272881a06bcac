"""The llama-family generator: a Hugging Face config.json in, a deployment folder out."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from . import manifest_cpu, manifest_cuda
from .config import ARCHITECTURES, ConfigError, shape_of

HERE = Path(__file__).parent


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def generate(config: dict, out_dir: str | Path, *, target: str = "cpu", model: str | None = None,
             **limits) -> Path:
    """Write manifest.json and kernels/ for this config into out_dir; return the manifest path."""
    shape = shape_of(config)
    model = model or config.get("_name_or_path") or shape.arch
    out = Path(out_dir)
    (out / "kernels").mkdir(parents=True, exist_ok=True)
    if target == "cpu":
        m = manifest_cpu.build(shape, model, **limits)
        dst = out / "kernels" / "llama_cpu.py"
        shutil.copyfile(HERE / "cpu" / "kernels.py", dst)
        m["modules"]["kernels"]["sha256"] = _sha(dst)
    elif target in ("cuda", "sm_90a"):
        from .cuda.build import build as build_cubins

        if shutil.which("nvcc") is None:
            raise ConfigError("building the sm_90a kernels needs nvcc (the CUDA toolkit) on PATH")

        m = manifest_cuda.build(shape, model, **limits)
        digests = build_cubins(out / "kernels")
        for name, mod in m["modules"].items():
            mod["sha256"] = digests[f"{name}.cubin"]
    else:
        raise ConfigError(f"target {target!r}: this generator builds cpu and cuda (sm_90a)")
    path = out / "manifest.json"
    path.write_text(json.dumps(m, indent=1) + "\n")
    return path


class _Generator:
    """What the engine finds through the kern.generators entry point."""

    name = "llama"
    architectures = ARCHITECTURES

    def accepts(self, config: dict) -> bool:
        return any(a in ARCHITECTURES for a in config.get("architectures") or [])

    def generate(self, config: dict, out_dir, *, target: str = "cpu", model: str | None = None, **limits) -> Path:
        return generate(config, out_dir, target=target, model=model, **limits)


GENERATOR = _Generator()
