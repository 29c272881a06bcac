"""The llama-family cubins: the pinned ones shipped in cubins/, or built with nvcc.

    python -m kern_models.llama.cuda.build OUT_DIR            build, print "<sha256>  <name>.cubin"
    python -m kern_models.llama.cuda.build OUT_DIR --check    also compare with cubins.sha256
    python -m kern_models.llama.cuda.build OUT_DIR --record   rewrite cubins.sha256 and cubins/

One cubin per .cu file in this folder, named after it, built with flags() (the arch and the tile
defines of table.py). Builds with the same nvcc release are byte-identical, so cubins.sha256
pins each cubin's SHA-256 together with the SHA-256 of its inputs (the flags, the .cu and the
headers): provide() copies the shipped cubin when its inputs are unchanged (a machine with only
the driver runs on the GPU) and runs nvcc only when they changed (a kernel developer's tree).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ..config import ConfigError
from .table import ARCH, TILES, VARIANTS

HERE = Path(__file__).resolve().parent
SHIPPED = HERE / "cubins"
SHA_FILE = HERE / "cubins.sha256"
BASE_FLAGS = ("-cubin", f"-arch={ARCH}", "-O3", "-std=c++17")


def flags(variant: str | None = None) -> tuple[str, ...]:
    if variant is not None and variant not in VARIANTS:
        raise ConfigError(f"variant {variant!r}: the llama kernels have {', '.join(sorted(VARIANTS))}")
    defines = tuple(f"-D{k}={v}" for k, v in sorted(TILES.items()))
    return (*BASE_FLAGS, *defines, *(VARIANTS[variant] if variant else ()))


def sources(folder: Path = HERE) -> list[Path]:
    return sorted(folder.glob("*.cu"))


def input_digest(src: Path, build_flags: tuple[str, ...]) -> str:
    """SHA-256 of what a cubin is made from: the flags, the source and every header here."""
    h = hashlib.sha256()
    h.update(" ".join(build_flags).encode() + b"\0")
    for f in (src, *sorted(HERE.glob("*.cuh"))):
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def nvcc_release(nvcc: str) -> str:
    out = subprocess.run([nvcc, "--version"], check=True, capture_output=True, text=True).stdout
    m = re.search(r"release (\d+\.\d+), V([\d.]+)", out)
    if not m:
        raise ConfigError(f"cannot read the release from `{nvcc} --version`")
    return m.group(2)


def compile_one(src: Path, out_dir: Path, nvcc: str, build_flags: tuple[str, ...]) -> Path:
    """nvcc one source (headers from this folder) into out_dir/<stem>.cubin."""
    out_dir.mkdir(parents=True, exist_ok=True)
    cubin = (out_dir / f"{src.stem}.cubin").resolve()
    # relative paths: the cubin must not depend on where the tree is checked out
    cmd = [nvcc, *build_flags, "-I", os.path.relpath(HERE, src.parent), src.name, "-o", str(cubin)]
    done = subprocess.run(cmd, cwd=src.parent, capture_output=True, text=True)
    if done.returncode != 0:
        raise ConfigError(f"nvcc failed on {src.name}:\n{done.stderr}")
    return cubin


def build(out_dir: Path, nvcc: str = "nvcc", variant: str | None = None,
          srcs: list[Path] | None = None) -> dict[str, str]:
    """Compile every kernel source (or srcs); return {cubin name: sha256}."""
    f = flags(variant)
    return {p.name: _sha(p) for p in (compile_one(s, out_dir, nvcc, f) for s in (srcs or sources()))}


@dataclass(frozen=True)
class Pin:
    cubin: str   # SHA-256 of the cubin
    inputs: str  # SHA-256 of the flags, source and headers it was built from


def read_pins(path: Path = SHA_FILE) -> tuple[str, dict[str, Pin]]:
    """(nvcc release, {cubin name: Pin}) from the recorded list."""
    release, pins = "", {}
    for line in path.read_text().splitlines():
        if line.startswith("# nvcc "):
            release = line.split()[2]
        elif line.strip() and not line.startswith("#"):
            digest, name, inputs = line.split()
            pins[name] = Pin(digest, inputs.removeprefix("inputs="))
    return release, pins


def read_recorded(path: Path = SHA_FILE) -> tuple[str, dict[str, str]]:
    """(nvcc release, {cubin name: sha256}) from the recorded list."""
    release, pins = read_pins(path)
    return release, {n: p.cubin for n, p in pins.items()}


def format_recorded(release: str, digests: dict[str, str]) -> str:
    f = flags()
    head = f"# nvcc {release} {' '.join(f)}\n# <cubin sha256>  <cubin>  inputs=<sha256 of flags, source, headers>\n"
    return head + "".join(f"{d}  {n}  inputs={input_digest(HERE / n.replace('.cubin', '.cu'), f)}\n"
                          for n, d in sorted(digests.items()))


def provide(out_dir: Path, variant: str | None = None) -> dict[str, str]:
    """Put every cubin in out_dir, {cubin name: sha256}: the shipped one where its pinned inputs
    are this tree's, else one built with nvcc; a ConfigError naming the cubin when neither can."""
    out_dir.mkdir(parents=True, exist_ok=True)
    f = flags(variant)
    _, pins = read_pins()
    nvcc = shutil.which("nvcc")
    out = {}
    for src in sources():
        name = f"{src.stem}.cubin"
        pin, shipped = pins.get(name), SHIPPED / name
        if pin and pin.inputs == input_digest(src, f) and shipped.is_file() and _sha(shipped) == pin.cubin:
            shutil.copyfile(shipped, out_dir / name)
            out[name] = pin.cubin
            continue
        if nvcc is None:
            why = (f"variant {variant!r} changes its build flags" if variant else
                   "its sources or flags differ from the pinned ones in cubins.sha256" if pin and shipped.is_file()
                   else "no pinned cubin ships for it")
            raise ConfigError(f"{name}: {why}, and building it needs nvcc (the CUDA toolkit) on PATH")
        out[name] = _sha(compile_one(src, out_dir, nvcc, f))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--check", action="store_true", help="compare with cubins.sha256 and the shipped cubins")
    ap.add_argument("--record", action="store_true", help="rewrite cubins.sha256 and copy the cubins to cubins/")
    ap.add_argument("--nvcc", default=shutil.which("nvcc") or "nvcc")
    args = ap.parse_args(argv)
    digests = build(args.out_dir, args.nvcc)
    for name, digest in sorted(digests.items()):
        print(f"{digest}  {name}")
    release = nvcc_release(args.nvcc)
    if args.record:
        SHA_FILE.write_text(format_recorded(release, digests))
        shutil.rmtree(SHIPPED, ignore_errors=True)
        SHIPPED.mkdir()
        for name in digests:
            shutil.copyfile(args.out_dir / name, SHIPPED / name)
        print(f"recorded {len(digests)} cubins in {SHA_FILE} and {SHIPPED}")
    if args.check:
        rec_release, pins = read_pins()
        if rec_release != release:
            print(f"cannot check: cubins.sha256 was made with nvcc {rec_release}, this is {release}")
            return 1
        shipped = {p.name: _sha(p) for p in SHIPPED.glob("*.cubin")}
        bad = sorted(n for n in pins.keys() | digests.keys() | shipped.keys()
                     if not (n in pins and pins[n].cubin == digests.get(n) == shipped.get(n)))
        for n in bad:
            print(f"mismatch: {n}: pinned {pins[n].cubin if n in pins else None}, built {digests.get(n)}, "
                  f"shipped {shipped.get(n)}")
        if bad:
            return 1
        print(f"ok: {len(digests)} cubins match cubins.sha256 and cubins/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
