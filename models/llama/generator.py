"""The llama-family generator: a Hugging Face config.json in, a deployment folder out."""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path, PurePosixPath

from . import manifest_cpu, manifest_cuda, tp as tensor_parallel
from .config import ARCHITECTURES, ConfigError, shape_of
from .cuda.build import compile_one, flags
from .cuda.build import provide as provide_cubins
from .cuda.table import ARCH
from .mega import build as mega_build
from .mega import manifest as mega_manifest

MEGA = "mega"  # the target of the one-kernel sm_90a manifest (mega/manifest.py)

HERE = Path(__file__).parent


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def generate(config: dict, out_dir: str | Path, *, target: str = "cpu", model: str | None = None,
             context: int | None = None, variant: str | None = None, tp: int = 1, tp_pdl: bool = True,
             tp_push: bool = True, tp_narrow: bool = False, tp_prefetch: bool = False, **limits) -> Path:
    """Write manifest.json and kernels/ for this config into out_dir; return the manifest path.
    tp > 1: one manifest a rank of a tensor-parallel split (tp.py), rank0.json ... beside the
    kernels; the path returned is rank 0's. tp_pdl: the split decode's projections and
    all-reduces under programmatic dependent launch; tp_push: decode's parts pushed to every
    rank and summed locally; tp_narrow (measured slower, off): a rank's gate/up projection on
    blocks of 4 outputs where blocks of 8 are few; tp_prefetch (measured slower, off): the projections after decode's all-reduces ask L2 for
    their weights during the wait (tp.shard).

    context: the longest sequence the deployment serves (default: the model's
    max_position_embeddings, clipped to what the kernels support). variant: for cuda, a kernel
    variant of cuda/table.py (VARIANTS), built with nvcc."""
    shape = shape_of(config)
    if limits.pop("ep", 1) != 1:
        raise ConfigError(f"ep: {shape.arch} has no experts to split (expert parallel is for mixtures of experts)")
    model = model or config.get("_name_or_path") or shape.arch
    out = Path(out_dir)
    (out / "kernels").mkdir(parents=True, exist_ok=True)
    if target == "cpu":
        if variant is not None:
            raise ConfigError(f"variant {variant!r}: kernel variants are for the cuda target")
        m = manifest_cpu.build(shape, model, context=context, **limits)
        dst = out / "kernels" / "llama_cpu.py"
        shutil.copyfile(HERE / "cpu" / "kernels.py", dst)
        m["modules"]["kernels"]["sha256"] = _sha(dst)
    elif target in ("cuda", ARCH):
        m = manifest_cuda.build(shape, model, context=context, **limits)
        digests = provide_cubins(out / "kernels", variant)
        for name, mod in m["modules"].items():
            mod["sha256"] = digests[f"{name}.cubin"]
    elif target == MEGA:
        m = mega_manifest.build(shape, model, context=context, **limits)
        digests = provide_cubins(out / "kernels", variant)
        digests[mega_build.CUBIN] = mega_build.provide(out / "kernels")
        for name, mod in m["modules"].items():
            mod["sha256"] = digests[f"{name}.cubin"]
        for stale in set(digests) - {f"{n}.cubin" for n in m["modules"]}:
            (out / "kernels" / stale).unlink()
    else:
        raise ConfigError(f"target {target!r}: this generator builds cpu, cuda ({ARCH}) and {MEGA} ({ARCH}, "
                          "decode as one kernel)")
    if tp != 1:
        tensor_parallel.check(shape, tp)
        for rank in range(tp):
            mr = tensor_parallel.shard(m, shape, tp, rank, pdl=tp_pdl, push=tp_push, narrow=tp_narrow,
                                      prefetch=tp_prefetch)
            tensor_parallel.add_module(mr, out / "kernels")
            (out / f"rank{rank}.json").write_text(json.dumps(mr, indent=1) + "\n")
        return out / "rank0.json"
    path = out / "manifest.json"
    path.write_text(json.dumps(m, indent=1) + "\n")
    return path


class _Generator:
    """What the engine finds through the kern.generators entry point."""

    name = "llama"
    architectures = ARCHITECTURES

    def accepts(self, config: dict) -> bool:
        return any(a in ARCHITECTURES for a in config.get("architectures") or [])

    def generate(self, config: dict, out_dir, *, target: str = "cpu", model: str | None = None,
                 context: int | None = None, tp: int = 1, **limits) -> Path:
        return generate(config, out_dir, target=target, model=model, context=context, tp=tp, **limits)

    def rebuild(self, source: str, target: str) -> bytes | None:
        """A module this generator writes, rebuilt from its source (kern kernels --rebuild), or
        None when `source` (a manifest's module source) is not one of ours. cpu: the kernels
        module as the generator copies it; cuda: nvcc with the pinned flags (variants aside)."""
        name = PurePosixPath(source).name
        if target == "cpu":
            return (HERE / "cpu" / "kernels.py").read_bytes() if name == "llama_cpu.py" else None
        src = HERE / "cuda" / f"{PurePosixPath(name).stem}.cu"
        if target != ARCH or not name.endswith(".cubin") or not src.is_file():
            return None
        nvcc = shutil.which("nvcc")
        if nvcc is None:
            raise ConfigError(f"rebuilding {name} needs nvcc (the CUDA toolkit) on PATH")
        with tempfile.TemporaryDirectory() as tmp:
            return compile_one(src, Path(tmp), nvcc, flags()).read_bytes()


GENERATOR = _Generator()
