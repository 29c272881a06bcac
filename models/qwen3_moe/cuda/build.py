"""moe.cubin: the pinned one shipped in cubins/, or built with nvcc (the llama family's rule:
kern_models.llama.cuda.build).

    python -m kern_models.qwen3_moe.cuda.build     build moe.cubin with nvcc, ship it and pin it
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from kern_models.llama.config import ConfigError
from kern_models.llama.cuda import build as dense

from .table import TILES

HERE = Path(__file__).resolve().parent
SRC = HERE / "moe.cu"
SHIPPED = HERE / "cubins" / "moe.cubin"
PIN = HERE / "cubins.sha256"


def flags() -> tuple[str, ...]:
    return (*dense.flags(), *(f"-D{k}={v}" for k, v in sorted(TILES.items())))


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def inputs() -> str:
    """SHA-256 of the flags, moe.cu and the shared headers."""
    return dense.input_digest(SRC, flags())


def provide(out_dir: Path) -> str:
    """moe.cubin into out_dir, its sha256: the shipped one when its pinned inputs are this
    tree's, else built with nvcc."""
    out_dir.mkdir(parents=True, exist_ok=True)
    digest, pinned = PIN.read_text().split() if PIN.is_file() else ("", "")
    if pinned.removeprefix("inputs=") == inputs() and SHIPPED.is_file() and _sha(SHIPPED) == digest:
        shutil.copyfile(SHIPPED, out_dir / "moe.cubin")
        return digest
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise ConfigError("moe.cubin: its sources differ from the pinned ones, and building it needs nvcc")
    return _sha(dense.compile_one(SRC, out_dir, nvcc, flags()))


def record() -> str:
    out = dense.compile_one(SRC, SHIPPED.parent, shutil.which("nvcc") or "nvcc", flags())
    line = f"{_sha(out)}  inputs={inputs()}\n"
    PIN.write_text(line)
    return line


def rebuild() -> bytes:
    import tempfile

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise ConfigError("rebuilding moe.cubin needs nvcc (the CUDA toolkit) on PATH")
    with tempfile.TemporaryDirectory() as tmp:
        return dense.compile_one(SRC, Path(tmp), nvcc, flags()).read_bytes()


if __name__ == "__main__":
    print(record(), end="")
