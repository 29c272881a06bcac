"""Build the llama-family CUDA kernels into cubins for sm_90a and print their SHA-256.

    python models/llama/cuda/build.py OUT_DIR            build, print "<sha256>  <name>.cubin"
    python models/llama/cuda/build.py OUT_DIR --check    also compare with cubins.sha256
    python models/llama/cuda/build.py OUT_DIR --record   rewrite cubins.sha256

One cubin per .cu file in this folder, named after it. Builds with the same nvcc release are
byte-identical, so cubins.sha256 (which records the release it was made with) pins them.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ARCH = "sm_90a"
FLAGS = ("-cubin", f"-arch={ARCH}", "-O3", "-std=c++17")
SHA_FILE = HERE / "cubins.sha256"


def sources() -> list[Path]:
    return sorted(HERE.glob("*.cu"))


def nvcc_release(nvcc: str) -> str:
    out = subprocess.run([nvcc, "--version"], check=True, capture_output=True, text=True).stdout
    m = re.search(r"release (\d+\.\d+), V([\d.]+)", out)
    if not m:
        raise RuntimeError(f"cannot read the release from `{nvcc} --version`:\n{out}")
    return m.group(2)


def build(out_dir: Path, nvcc: str = "nvcc", extra: tuple[str, ...] = ()) -> dict[str, str]:
    """Compile every kernel source; return {cubin name: sha256}. `extra` flags (e.g. -D...) are
    for experiments only: the pinned digests are those of the plain build."""
    out_dir.mkdir(parents=True, exist_ok=True)
    digests = {}
    for src in sources():
        cubin = out_dir / f"{src.stem}.cubin"
        cmd = [nvcc, *FLAGS, *extra, "-I", ".", src.name, "-o", str(cubin.resolve())]
        done = subprocess.run(cmd, cwd=HERE, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"nvcc failed on {src.name}:\n{done.stderr}")
        digests[cubin.name] = hashlib.sha256(cubin.read_bytes()).hexdigest()
    return digests


def read_recorded(path: Path = SHA_FILE) -> tuple[str, dict[str, str]]:
    """(nvcc release, {cubin name: sha256}) from the recorded list."""
    release, digests = "", {}
    for line in path.read_text().splitlines():
        if line.startswith("# nvcc "):
            release = line.split()[2]
        elif line.strip() and not line.startswith("#"):
            digest, name = line.split()
            digests[name] = digest
    return release, digests


def format_recorded(release: str, digests: dict[str, str]) -> str:
    head = f"# nvcc {release} {' '.join(FLAGS)}\n"
    return head + "".join(f"{d}  {n}\n" for n, d in sorted(digests.items()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--check", action="store_true", help="compare with cubins.sha256")
    ap.add_argument("--record", action="store_true", help="rewrite cubins.sha256")
    ap.add_argument("--nvcc", default=shutil.which("nvcc") or "nvcc")
    args = ap.parse_args(argv)
    digests = build(args.out_dir, args.nvcc)
    for name, digest in sorted(digests.items()):
        print(f"{digest}  {name}")
    release = nvcc_release(args.nvcc)
    if args.record:
        SHA_FILE.write_text(format_recorded(release, digests))
        print(f"recorded {len(digests)} cubins in {SHA_FILE}")
    if args.check:
        rec_release, recorded = read_recorded()
        if rec_release != release:
            print(f"cannot check: cubins.sha256 was made with nvcc {rec_release}, this is {release}")
            return 1
        bad = sorted(n for n in recorded.keys() | digests.keys() if recorded.get(n) != digests.get(n))
        for n in bad:
            print(f"mismatch: {n}: recorded {recorded.get(n)}, built {digests.get(n)}")
        if bad:
            return 1
        print(f"ok: {len(digests)} cubins match cubins.sha256")
    return 0


if __name__ == "__main__":
    sys.exit(main())
