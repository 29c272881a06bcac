"""Read models/llama/cuda: the `sig` lines of KERNELS.md and the extern "C" kernels of the
.cu sources, as {entry: (module, kinds)} and {entry: kinds}."""

from __future__ import annotations

import re
from pathlib import Path

KERNEL_DIR = Path(__file__).resolve().parents[2] / "models" / "llama" / "cuda"

_HEADING = re.compile(r"^### .*\((\w+)\.cubin\)")
_SIG = re.compile(r"^sig\s+(\w+)\((.*)\)\s*$")
_EXTERN = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s*)?'
                     r"(\w+)\s*\(([^)]*)\)", re.S)


def documented() -> dict[str, tuple[str, tuple[str, ...]]]:
    """{entry: (module stem, (kind, ...))} from KERNELS.md."""
    out, module = {}, None
    for line in (KERNEL_DIR / "KERNELS.md").read_text().splitlines():
        if m := _HEADING.match(line):
            module = m.group(1)
        elif m := _SIG.match(line.strip()):
            kinds = tuple(p.split()[0] for p in m.group(2).split(",") if p.strip())
            out[m.group(1)] = (module, kinds)
    return out


def _c_kind(param: str) -> str:
    p = " ".join(param.split())
    if "*" in p:
        return "ptr"
    if re.search(r"\b(long long|int64_t)\b", p):
        return "i64"
    if re.search(r"\bfloat\b", p):
        return "f32"
    if re.search(r"\bint\b", p):
        return "i32"
    raise ValueError(f"unknown parameter type in {param!r}")


def in_sources() -> dict[str, tuple[str, tuple[str, ...]]]:
    """{entry: (module stem, (kind, ...))} from the extern "C" kernels of the .cu files."""
    out = {}
    for src in sorted(KERNEL_DIR.glob("*.cu")):
        text = re.sub(r"//[^\n]*", "", src.read_text())
        for m in _EXTERN.finditer(text):
            out[m.group(1)] = (src.stem, tuple(_c_kind(p) for p in m.group(2).split(",")))
    return out
