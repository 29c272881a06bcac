"""The megakernel's cubin: the pinned one shipped in cubins/, or built with nvcc.

    python -m kern_models.llama.mega.build OUT_DIR            build, print "<sha256>  mega.cubin"
    python -m kern_models.llama.mega.build OUT_DIR --record   rewrite mega.sha256 and cubins/

mega.cu includes the per-op kernels' headers (../cuda: common.cuh, gemv.cuh, rope.cuh) and is
built with their flags (the arch and table.py's tile defines), so cuda/build.py's compile and
input digest serve here too; mega.sha256 pins the cubin with the digest of what it is built from.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import sys
from pathlib import Path

from ..config import ConfigError
from ..cuda.build import compile_one, flags, input_digest, nvcc_release, read_pins

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "mega.cu"
SHIPPED = HERE / "cubins"
SHA_FILE = HERE / "mega.sha256"
CUBIN = "mega.cubin"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def provide(out_dir: Path) -> str:
    """Put mega.cubin in out_dir and return its sha256: the shipped one when its pinned inputs are
    this tree's, else one built with nvcc; a ConfigError when neither can be had."""
    out_dir.mkdir(parents=True, exist_ok=True)
    f = flags()
    pin = read_pins(SHA_FILE)[1].get(CUBIN) if SHA_FILE.is_file() else None
    shipped = SHIPPED / CUBIN
    if pin and pin.inputs == input_digest(SOURCE, f) and shipped.is_file() and _sha(shipped) == pin.cubin:
        shutil.copyfile(shipped, out_dir / CUBIN)
        return pin.cubin
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise ConfigError(f"{CUBIN}: its sources differ from the pinned ones in {SHA_FILE.name} (or none ships), "
                          "and building it needs nvcc (the CUDA toolkit) on PATH")
    return _sha(compile_one(SOURCE, out_dir, nvcc, f))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--record", action="store_true", help="rewrite mega.sha256 and copy the cubin to cubins/")
    ap.add_argument("--nvcc", default=shutil.which("nvcc") or "nvcc")
    args = ap.parse_args(argv)
    f = flags()
    digest = _sha(compile_one(SOURCE, args.out_dir, args.nvcc, f))
    print(f"{digest}  {CUBIN}")
    if args.record:
        SHA_FILE.write_text(f"# nvcc {nvcc_release(args.nvcc)} {' '.join(f)}\n"
                            f"{digest}  {CUBIN}  inputs={input_digest(SOURCE, f)}\n")
        SHIPPED.mkdir(exist_ok=True)
        shutil.copyfile(args.out_dir / CUBIN, SHIPPED / CUBIN)
        print(f"recorded {CUBIN} in {SHA_FILE} and {SHIPPED}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
