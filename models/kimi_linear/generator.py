"""The Kimi-Linear generator: a Hugging Face config.json in, a deployment folder out."""

from __future__ import annotations

import shutil
from pathlib import Path, PurePosixPath

from kern_models.common import deployment
from kern_models.common.cubins import sha256_of
from kern_models.common.errors import ConfigError, check_batch_invariant, refuse
from kern_models.common.generator import FamilyGenerator
from kern_models.llama.kernels.cuda import CUBINS as DENSE_CUBINS
from kern_models.qwen3_moe.kernels.cuda import CUBINS as MOE_CUBINS

from .config import ARCHITECTURES, shape_of
from .kernels.cuda import CUBINS
from .kernels.cuda.table import ARCH
from .manifests import cpu as manifest_cpu, cuda as manifest_cuda


def generate(config: dict, out_dir: str | Path, *, target: str = "cpu", model: str | None = None,
             context: int | None = None, tp: int = 1, ep: int = 1, batch_invariant: bool = True, **limits) -> Path:
    """Write manifest.json and kernels/ for this config into out_dir; return the manifest path."""
    shape = shape_of(config)
    # the cpu build is batch-invariant, its only one; sm_90a has the faster one too (docs/determinism.md)
    check_batch_invariant(batch_invariant, "kimi_linear", target, has_faster=target != "cpu")
    for split, n in (("tp", tp), ("ep", ep)):
        if n != 1:
            raise refuse("kimi_linear", split, n, "runs on one device: it has no split build")
    if target not in ("cpu", "cuda", ARCH):
        raise ConfigError(f"target {target!r}: this generator builds cpu and cuda ({ARCH})")
    model = model or config.get("_name_or_path") or ARCHITECTURES[0]
    out = Path(out_dir)
    (out / "kernels").mkdir(parents=True, exist_ok=True)
    if target == "cpu":
        m = manifest_cpu.build(shape, model, context=context, **limits)
        for name, (file, src) in manifest_cpu.MODULES.items():
            shutil.copyfile(src, out / "kernels" / file)
            m["modules"][name]["sha256"] = sha256_of(out / "kernels" / file)
        return deployment.write(out, m)
    m = manifest_cuda.build(shape, model, context=context, batch_invariant=batch_invariant, **limits)
    digests = {}
    for cubins in (CUBINS, MOE_CUBINS, DENSE_CUBINS):  # each module from the family whose source makes it
        names = sorted({f"{n}.cubin" for n in m["modules"]} & {f"{s.stem}.cubin" for s in cubins.sources()} - set(digests))
        digests |= cubins.provide(out / "kernels", names)
    for name, mod in m["modules"].items():
        mod["sha256"] = digests[f"{name}.cubin"]
    return deployment.write(out, m)


class _Generator(FamilyGenerator):
    name = "kimi_linear"
    architectures = ARCHITECTURES
    generate = staticmethod(generate)

    def rebuild(self, source: str, target: str) -> bytes | None:
        """This family's own module rebuilt from its source (kern kernels --rebuild); the llama
        and Qwen3-MoE modules it ships are theirs to rebuild."""
        file, src = manifest_cpu.MODULES[manifest_cpu.MODULE]
        if target == ARCH:
            return CUBINS.rebuild(PurePosixPath(source).name)
        return src.read_bytes() if target == "cpu" and PurePosixPath(source).name == file else None


GENERATOR = _Generator()
