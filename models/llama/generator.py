"""The llama-family generator: a Hugging Face config.json in, a deployment folder out."""

from __future__ import annotations

import shutil
from pathlib import Path, PurePosixPath

from kern_models.common import deployment
from kern_models.common.cubins import sha256_of
from kern_models.common.errors import check_batch_invariant, refuse
from kern_models.common.generator import FamilyGenerator

from .config import ARCHITECTURES, ConfigError, shape_of
from .kernels.cuda import CUBINS
from .kernels.cuda.table import ARCH
from .manifests import cpu as manifest_cpu, cuda as manifest_cuda, mega as manifest_mega, tp as tensor_parallel

MEGA = "mega"  # the target of the one-kernel sm_90a manifest (manifests/mega.py)
CPU_KERNELS = Path(__file__).resolve().parent / "kernels" / "cpu" / "kernels.py"


def generate(config: dict, out_dir: str | Path, *, target: str = "cpu", model: str | None = None,
             context: int | None = None, tp: int = 1, ep: int = 1, batch_invariant: bool = True,
             tp_pdl: bool = True, **limits) -> Path:
    """Write manifest.json and kernels/ for this config into out_dir; return the manifest path.
    tp > 1: one manifest a rank of a tensor-parallel split (manifests/tp.py), rank0.json ...
    beside the kernels; the path returned is rank 0's. tp_pdl: the split decode's projections
    and all-reduces under programmatic dependent launch. batch_invariant=False: the cuda
    build whose bytes depend on the batch (docs/determinism.md).

    context: the longest sequence the deployment serves (default: the model's
    max_position_embeddings, clipped to what the kernels support)."""
    shape = shape_of(config)
    if ep != 1:
        raise refuse("llama", "ep", ep, f"({shape.arch}) has no experts to split (expert parallel is for mixtures "
                     "of experts)")
    model = model or config.get("_name_or_path") or shape.arch
    # cuda's programs, invariant or not; the cpu's and mega's are batch-invariant, their only build
    batch_invariant = check_batch_invariant(batch_invariant, "llama", target, has_faster=target in ("cuda", ARCH))
    out = Path(out_dir)
    (out / "kernels").mkdir(parents=True, exist_ok=True)
    if target == "cpu":
        m = manifest_cpu.build(shape, model, context=context, **limits)
        dst = out / "kernels" / "llama_cpu.py"
        shutil.copyfile(CPU_KERNELS, dst)
        m["modules"]["kernels"]["sha256"] = sha256_of(dst)
    elif target in ("cuda", ARCH, MEGA):
        if target == MEGA:
            m = manifest_mega.build(shape, model, context=context, **limits)
        else:
            # the faster build's split keeps the gemv program up to 32 sequences: its crossover with
            # cuBLASLt was measured on one GPU (bench/crossover.py), not for a rank's share of a
            # larger model; the invariant build splits its own programs (manifests/tp.py's pushed
            # projections)
            sizes = {"seqs": manifest_cuda.DECODE_SEQS, **limits} if tp != 1 and not batch_invariant else limits
            m = manifest_cuda.build(shape, model, context=context, batch_invariant=batch_invariant, **sizes)
        digests = CUBINS.provide(out / "kernels", [f"{name}.cubin" for name in m["modules"]])
        for name, mod in m["modules"].items():
            mod["sha256"] = digests[f"{name}.cubin"]
    else:
        raise ConfigError(f"target {target!r}: this generator builds cpu, cuda ({ARCH}) and {MEGA} ({ARCH}, "
                          "decode as one kernel)")
    if tp != 1:
        tensor_parallel.check(shape, tp)
    return deployment.write(out, m, tp, lambda rank: tensor_parallel.shard(m, shape, tp, rank, pdl=tp_pdl),
                            tensor_parallel.add_module)


class _Generator(FamilyGenerator):
    name = "llama"
    architectures = ARCHITECTURES
    generate = staticmethod(generate)

    def rebuild(self, source: str, target: str) -> bytes | None:
        """A module this generator writes, rebuilt from its source (kern kernels --rebuild), or
        None when `source` (a manifest's module source) is not one of ours. cpu: the kernel
        modules as the generator copies them; cuda: nvcc with the pinned flags (every cubin)."""
        name = PurePosixPath(source).name
        if target == "cpu":
            cpu = {"llama_cpu.py": CPU_KERNELS, "collectives.py": tensor_parallel.CPU_MODULE}
            return cpu[name].read_bytes() if name in cpu else None
        return CUBINS.rebuild(name) if target == ARCH else None


GENERATOR = _Generator()
