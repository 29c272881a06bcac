"""The Qwen3-MoE generator: a Hugging Face config.json in, a deployment folder out.

The dense parts are the llama family's (its manifests, its kernels, its generator's plumbing);
this family adds the MoE block's kernels and, with ep > 1, one manifest a rank of an expert-
parallel split (expert_parallel.py)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path, PurePosixPath

from kern_models.llama.config import ConfigError
from kern_models.llama.generator import GENERATOR as DENSE

from kern_models.llama.cuda.build import provide as provide_dense_cubins
from kern_models.llama.cuda.table import ARCH

from . import expert_parallel, manifest_cpu, manifest_cuda
from .config import ARCHITECTURES, shape_of
from .cuda import build as moe_build

HERE = Path(__file__).parent
CPU_MODULES = {"kernels": ("llama_cpu.py", HERE.parent / "llama" / "cpu" / "kernels.py"),
               manifest_cpu.MODULE: ("qwen3_moe_cpu.py", HERE / "cpu" / "kernels.py")}


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def generate(config: dict, out_dir: str | Path, *, target: str = "cpu", model: str | None = None,
             context: int | None = None, ep: int = 1, **limits) -> Path:
    """Write manifest.json and kernels/ for this config into out_dir; return the manifest path.
    ep > 1: one manifest a rank of an expert-parallel split (expert_parallel.py), rank0.json ...
    beside the kernels; the path returned is rank 0's."""
    shape = shape_of(config)
    model = model or config.get("_name_or_path") or shape.dense.arch
    out = Path(out_dir)
    (out / "kernels").mkdir(parents=True, exist_ok=True)
    if limits.get("tp", 1) != 1:
        raise ConfigError(f"tp {limits['tp']}: a Qwen3-MoE deployment splits its experts (ep), not its heads (tp)")
    limits.pop("tp", None)
    if target == "cpu":
        m = manifest_cpu.build(shape, model, context=context, **limits)
        for name, (file, src) in CPU_MODULES.items():
            shutil.copyfile(src, out / "kernels" / file)
            m["modules"][name] = {"source": f"kernels/{file}", "sha256": _sha(out / "kernels" / file)}
    elif target in ("cuda", ARCH):
        m = manifest_cuda.build(shape, model, context=context, **limits)
        digests = provide_dense_cubins(out / "kernels")
        digests["moe.cubin"] = moe_build.provide(out / "kernels")
        for name, mod in m["modules"].items():
            mod["sha256"] = digests[f"{name}.cubin"]
        for stale in set(digests) - {f"{n}.cubin" for n in m["modules"]}:
            (out / "kernels" / stale).unlink()
    else:
        raise ConfigError(f"target {target!r}: this generator builds cpu and cuda ({ARCH})")
    if ep != 1:
        expert_parallel.check(shape, ep)
        for rank in range(ep):
            mr = expert_parallel.shard(m, shape, ep, rank)
            expert_parallel.add_module(mr, out / "kernels")
            (out / f"rank{rank}.json").write_text(json.dumps(mr, indent=1) + "\n")
        return out / "rank0.json"
    path = out / "manifest.json"
    path.write_text(json.dumps(m, indent=1) + "\n")
    return path


class _Generator:
    """What the engine finds through the kern.generators entry point."""

    name = "qwen3_moe"
    architectures = ARCHITECTURES

    def accepts(self, config: dict) -> bool:
        return any(a in ARCHITECTURES for a in config.get("architectures") or [])

    def generate(self, config: dict, out_dir, *, target: str = "cpu", model: str | None = None,
                 context: int | None = None, **limits) -> Path:
        return generate(config, out_dir, target=target, model=model, context=context, **limits)

    def rebuild(self, source: str, target: str) -> bytes | None:
        """A module this generator writes, rebuilt from its source (kern kernels --rebuild); the
        dense modules are the llama generator's."""
        name = PurePosixPath(source).name
        if target == "cpu":
            for file, src in CPU_MODULES.values():
                if name == file:
                    return src.read_bytes()
        if target == ARCH and name == "moe.cubin":
            return moe_build.rebuild()
        return DENSE.rebuild(source, target)


GENERATOR = _Generator()
