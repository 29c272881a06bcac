"""The Qwen3-MoE generator: a Hugging Face config.json in, a deployment folder out.

The dense parts are the llama family's (its manifests, its kernels, its generator's plumbing);
this family adds the MoE block's kernels and, with ep > 1, one manifest a rank of an expert-
parallel split (manifests/ep.py)."""

from __future__ import annotations

import shutil
from pathlib import Path, PurePosixPath

from kern_models.common import deployment
from kern_models.common.cubins import sha256_of
from kern_models.common.errors import ConfigError, check_batch_invariant, refuse
from kern_models.common.generator import FamilyGenerator
from kern_models.llama.generator import CPU_KERNELS as DENSE_CPU_KERNELS, GENERATOR as DENSE
from kern_models.llama.kernels.cuda import CUBINS as DENSE_CUBINS
from kern_models.llama.kernels.cuda.table import ARCH

from .config import ARCHITECTURES, shape_of
from .kernels.cuda import CUBINS
from .manifests import cpu as manifest_cpu, cuda as manifest_cuda, ep as expert_parallel

CPU_MODULES = {"kernels": ("llama_cpu.py", DENSE_CPU_KERNELS),
               manifest_cpu.MODULE: ("qwen3_moe_cpu.py", Path(__file__).resolve().parent / "kernels" / "cpu" /
                                     "kernels.py")}


def generate(config: dict, out_dir: str | Path, *, target: str = "cpu", model: str | None = None,
             context: int | None = None, tp: int = 1, ep: int = 1, batch_invariant: bool = True, **limits) -> Path:
    """Write manifest.json and kernels/ for this config into out_dir; return the manifest path.
    ep > 1: one manifest a rank of an expert-parallel split (manifests/ep.py), rank0.json ...
    beside the kernels; the path returned is rank 0's."""
    shape = shape_of(config)
    # sm_90a: the batch-invariant build (the default) or the faster one; the cpu's is invariant, its only one
    batch_invariant = check_batch_invariant(batch_invariant, "qwen3_moe", target, has_faster=target != "cpu")
    if tp != 1:
        raise refuse("qwen3_moe", "tp", tp, "splits its experts (--ep), not its heads: there is no tensor-parallel "
                     "build of a mixture of experts")
    model = model or config.get("_name_or_path") or shape.dense.arch
    out = Path(out_dir)
    (out / "kernels").mkdir(parents=True, exist_ok=True)
    if target == "cpu":
        m = manifest_cpu.build(shape, model, context=context, **limits)
        for name, (file, src) in CPU_MODULES.items():
            shutil.copyfile(src, out / "kernels" / file)
            m["modules"][name] = {"source": f"kernels/{file}", "sha256": sha256_of(out / "kernels" / file)}
    elif target in ("cuda", ARCH):
        m = manifest_cuda.build(shape, model, context=context, batch_invariant=batch_invariant, **limits)
        mine = {f"{n}.cubin" for n in m["modules"]} & {f"{s.stem}.cubin" for s in CUBINS.sources()}
        digests = {**DENSE_CUBINS.provide(out / "kernels", sorted({f"{n}.cubin" for n in m["modules"]} - mine)),
                   **CUBINS.provide(out / "kernels", sorted(mine))}
        for name, mod in m["modules"].items():
            mod["sha256"] = digests[f"{name}.cubin"]
    else:
        raise ConfigError(f"target {target!r}: this generator builds cpu and cuda ({ARCH})")
    if ep != 1:
        expert_parallel.check(shape, ep)
    return deployment.write(out, m, ep, lambda rank: expert_parallel.shard(m, shape, ep, rank),
                            expert_parallel.add_module)


class _Generator(FamilyGenerator):
    name = "qwen3_moe"
    architectures = ARCHITECTURES
    generate = staticmethod(generate)

    def rebuild(self, source: str, target: str) -> bytes | None:
        """A module this generator writes, rebuilt from its source (kern kernels --rebuild); the
        dense modules are the llama generator's."""
        name = PurePosixPath(source).name
        if target == "cpu" and name == CPU_MODULES[manifest_cpu.MODULE][0]:
            return CPU_MODULES[manifest_cpu.MODULE][1].read_bytes()
        if target == ARCH and (got := CUBINS.rebuild(name)) is not None:
            return got
        return DENSE.rebuild(source, target)


GENERATOR = _Generator()
