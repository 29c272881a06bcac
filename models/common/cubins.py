"""A model family's cubins, one way for every family: pinned ones shipped beside the sources,
or built with nvcc.

    python -m kern_models.common.cubins FAMILY OUT_DIR            build, print "<sha256>  <name>.cubin"
    python -m kern_models.common.cubins FAMILY OUT_DIR --check    also compare with the pins and cubins/
    python -m kern_models.common.cubins FAMILY OUT_DIR --record   rewrite the pins and cubins/

FAMILY is a family package of kern_models (llama); its `kernels/cuda` package holds CUBINS, a
Cubins over that folder. One cubin per .cu file there, named after it, every one built with the
same flags (the arch and the family's tile defines), with the family's folder and this
package's cuda/ (the shared helpers) on the include path. Builds with the same nvcc release are
byte-identical, so the folder's cubins.sha256 pins each cubin's SHA-256 together with the
SHA-256 of its inputs (the flags, the .cu and every header): provide() copies the shipped cubin
(cubins/) when its inputs are unchanged, so a machine with only the driver runs on the GPU, and
runs nvcc only when they changed (a kernel developer's tree).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ConfigError

COMMON_CUDA = Path(__file__).resolve().parent / "cuda"
PINS = "cubins.sha256"
SHIPPED = "cubins"


def sha256_of(path: Path) -> str:
    """The SHA-256 of a file, as manifests pin modules."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def nvcc_release(nvcc: str) -> str:
    out = subprocess.run([nvcc, "--version"], check=True, capture_output=True, text=True).stdout
    m = re.search(r"release (\d+\.\d+), V([\d.]+)", out)
    if not m:
        raise ConfigError(f"cannot read the release from `{nvcc} --version`")
    return m.group(2)


@dataclass(frozen=True)
class Pin:
    cubin: str   # SHA-256 of the cubin
    inputs: str  # SHA-256 of the flags, source and headers it was built from


@dataclass(frozen=True)
class Cubins:
    """The cubins of one family: every .cu of `folder`, built for `arch` with `defines` (-D).
    includes: other families' kernel folders whose headers these sources include (Qwen3-MoE's
    include llama's gemv.cuh), on the include path and in every cubin's input digest."""

    folder: Path
    arch: str
    defines: dict = field(default_factory=dict)
    includes: tuple[Path, ...] = ()

    @property
    def shipped(self) -> Path:
        return self.folder / SHIPPED

    @property
    def pins_file(self) -> Path:
        return self.folder / PINS

    def flags(self, extra: tuple[str, ...] = ()) -> tuple[str, ...]:
        defines = tuple(f"-D{k}={v}" for k, v in sorted(self.defines.items()))
        return ("-cubin", f"-arch={self.arch}", "-O3", "-std=c++17", *defines, *extra)

    def sources(self, folder: Path | None = None) -> list[Path]:
        return sorted((folder or self.folder).glob("*.cu"))

    def headers(self) -> list[Path]:
        """Every header a source may include: the family's and the shared ones, by name."""
        return sorted([*self.folder.glob("*.cuh"), *COMMON_CUDA.glob("*.cuh"),
                       *(h for d in self.includes for h in d.glob("*.cuh"))], key=lambda p: (p.name, str(p)))

    def input_digest(self, src: Path, build_flags: tuple[str, ...] | None = None) -> str:
        """SHA-256 of what a cubin is made from: the flags, the source and every header."""
        h = hashlib.sha256()
        h.update(" ".join(self.flags() if build_flags is None else build_flags).encode() + b"\0")
        for f in (src, *self.headers()):
            h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
        return h.hexdigest()

    def compile(self, src: Path, out_dir: Path, nvcc: str, extra: tuple[str, ...] = ()) -> Path:
        """nvcc one source into out_dir/<stem>.cubin."""
        out_dir.mkdir(parents=True, exist_ok=True)
        cubin = (out_dir / f"{src.stem}.cubin").resolve()
        # relative paths: the cubin must not depend on where the tree is checked out
        includes = [a for d in (self.folder, COMMON_CUDA, *self.includes)
                    for a in ("-I", os.path.relpath(d, src.parent))]
        cmd = [nvcc, *self.flags(extra), *includes, src.name, "-o", str(cubin)]
        done = subprocess.run(cmd, cwd=src.parent, capture_output=True, text=True)
        if done.returncode != 0:
            raise ConfigError(f"nvcc failed on {src.name}:\n{done.stderr}")
        return cubin

    def build(self, out_dir: Path, nvcc: str = "nvcc", srcs: list[Path] | None = None,
              extra: tuple[str, ...] = ()) -> dict[str, str]:
        """Compile every source (or srcs); return {cubin name: sha256}."""
        return {p.name: sha256_of(p) for p in (self.compile(s, out_dir, nvcc, extra) for s in (srcs or self.sources()))}

    def read_pins(self) -> tuple[str, dict[str, Pin]]:
        """(nvcc release, {cubin name: Pin}) from the pins file."""
        release, pins = "", {}
        for line in self.pins_file.read_text().splitlines():
            if line.startswith("# nvcc "):
                release = line.split()[2]
            elif line.strip() and not line.startswith("#"):
                digest, name, inputs = line.split()
                pins[name] = Pin(digest, inputs.removeprefix("inputs="))
        return release, pins

    def format_pins(self, release: str, digests: dict[str, str]) -> str:
        head = (f"# nvcc {release} {' '.join(self.flags())}\n"
                "# <cubin sha256>  <cubin>  inputs=<sha256 of flags, source, headers>\n")
        return head + "".join(f"{d}  {n}  inputs={self.input_digest(self.folder / n.replace('.cubin', '.cu'))}\n"
                              for n, d in sorted(digests.items()))

    def provide(self, out_dir: Path, names: list[str] | None = None) -> dict[str, str]:
        """Put each named cubin (default: every one) in out_dir, {cubin name: sha256}: the shipped
        one where its pinned inputs are this tree's, else one built with nvcc; a ConfigError
        naming the cubin when neither can be had."""
        out_dir.mkdir(parents=True, exist_ok=True)
        _, pins = self.read_pins()
        nvcc = shutil.which("nvcc")
        out = {}
        for name in names or [f"{s.stem}.cubin" for s in self.sources()]:
            src = self.folder / name.replace(".cubin", ".cu")
            if not src.is_file():
                raise ConfigError(f"{name}: no kernel source {src.name} in {self.folder}")
            pin, shipped = pins.get(name), self.shipped / name
            if pin and pin.inputs == self.input_digest(src) and shipped.is_file() and sha256_of(shipped) == pin.cubin:
                shutil.copyfile(shipped, out_dir / name)
                out[name] = pin.cubin
                continue
            if nvcc is None:
                why = (f"its sources or flags differ from the pinned ones in {PINS}" if pin and shipped.is_file()
                       else "no pinned cubin ships for it")
                raise ConfigError(f"{name}: {why}, and building it needs nvcc (the CUDA toolkit) on PATH")
            out[name] = sha256_of(self.compile(src, out_dir, nvcc))
        return out

    def rebuild(self, name: str) -> bytes | None:
        """The cubin `name` built from its source with the pinned flags (kern kernels --rebuild),
        or None when no source of this folder makes it."""
        src = self.folder / name.replace(".cubin", ".cu")
        if not name.endswith(".cubin") or not src.is_file():
            return None
        nvcc = shutil.which("nvcc")
        if nvcc is None:
            raise ConfigError(f"rebuilding {name} needs nvcc (the CUDA toolkit) on PATH")
        with tempfile.TemporaryDirectory() as tmp:
            return self.compile(src, Path(tmp), nvcc).read_bytes()

    def record(self, out_dir: Path, release: str, digests: dict[str, str]) -> None:
        """Pin the cubins built into out_dir and ship them."""
        self.pins_file.write_text(self.format_pins(release, digests))
        shutil.rmtree(self.shipped, ignore_errors=True)
        self.shipped.mkdir()
        for name in digests:
            shutil.copyfile(out_dir / name, self.shipped / name)

    def check(self, release: str, digests: dict[str, str]) -> list[str]:
        """Every disagreement between the built cubins, the pins and the shipped cubins."""
        pinned_release, pins = self.read_pins()
        if pinned_release != release:
            return [f"cannot check: {PINS} was made with nvcc {pinned_release}, this is {release}"]
        shipped = {p.name: sha256_of(p) for p in self.shipped.glob("*.cubin")}
        return [f"mismatch: {n}: pinned {pins[n].cubin if n in pins else None}, built {digests.get(n)}, "
                f"shipped {shipped.get(n)}"
                for n in sorted(pins.keys() | digests.keys() | shipped.keys())
                if not (n in pins and pins[n].cubin == digests.get(n) == shipped.get(n))]


def of_family(family: str) -> Cubins:
    """The Cubins of family package kern_models.<family> (its kernels/cuda package's CUBINS)."""
    try:
        return importlib.import_module(f"kern_models.{family}.kernels.cuda").CUBINS
    except (ModuleNotFoundError, AttributeError):
        raise ConfigError(f"family {family!r}: no kern_models.{family}.kernels.cuda with CUBINS") from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("family", help="a family package of kern_models, e.g. llama")
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--check", action="store_true", help="compare with the pins and the shipped cubins")
    ap.add_argument("--record", action="store_true", help="rewrite the pins and copy the cubins to cubins/")
    ap.add_argument("--nvcc", default=shutil.which("nvcc") or "nvcc")
    args = ap.parse_args(argv)
    cubins = of_family(args.family)
    digests = cubins.build(args.out_dir, args.nvcc)
    for name, digest in sorted(digests.items()):
        print(f"{digest}  {name}")
    release = nvcc_release(args.nvcc)
    if args.record:
        cubins.record(args.out_dir, release, digests)
        print(f"recorded {len(digests)} cubins in {cubins.pins_file} and {cubins.shipped}")
    if args.check:
        bad = cubins.check(release, digests)
        for line in bad:
            print(line)
        if bad:
            return 1
        print(f"ok: {len(digests)} cubins match {PINS} and {SHIPPED}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
