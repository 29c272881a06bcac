"""Read the kernel sources: the extern "C" __global__ entries of models/llama/kernels/cuda (the shipped
kernels) and tests/cuda/kernels (test-only references), with their parameters."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

KERNEL_DIR = Path(__file__).resolve().parents[2] / "models" / "llama" / "kernels" / "cuda"
TEST_KERNEL_DIR = Path(__file__).resolve().parent / "kernels"

_EXTERN = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s*)?'
                     r"(\w+)\s*\(([^)]*)\)", re.S)
_PARAM = re.compile(r"^(const\s+)?((?:unsigned\s+)?(?:long long|\w+))\s*(\*)?\s*(?:__restrict__\s*)?(\w+)$")


@dataclass(frozen=True)
class CParam:
    name: str
    ctype: str     # bf16, float, int, char, unsigned, unsigned long long
    pointer: bool
    const: bool

    @property
    def kind(self) -> str:
        """ptr, i32 or f32: the cubin's view of it."""
        return "ptr" if self.pointer else {"int": "i32", "float": "f32"}[self.ctype]


def _param(text: str) -> CParam:
    m = _PARAM.match(" ".join(text.split()))
    if not m:
        raise ValueError(f"cannot read the kernel parameter {text!r}")
    return CParam(m.group(4), m.group(2), m.group(3) is not None, m.group(1) is not None)


_LOCAL_INCLUDE = re.compile(r'^#include "(\w+\.cuh)"', re.M)


def _with_headers(src: Path, seen: set[Path]) -> str:
    """A source's text with the text of each header of its own folder it includes (a header may
    hold kernels, built into the including source's module: kimi_linear's kda_conv.cuh)."""
    text = src.read_text()
    for name in _LOCAL_INCLUDE.findall(text):
        h = src.parent / name
        if h.exists() and h not in seen:
            seen.add(h)
            text += "\n" + _with_headers(h, seen)
    return text


def in_sources(folder: Path = KERNEL_DIR) -> dict[str, tuple[str, tuple[CParam, ...]]]:
    """{entry: (module stem, params)} from the extern "C" kernels of the folder's .cu files
    (and the folder's headers they include)."""
    out = {}
    for src in sorted(folder.glob("*.cu")):
        text = re.sub(r"//[^\n]*", "", _with_headers(src, set()))
        for m in _EXTERN.finditer(text):
            out[m.group(1)] = (src.stem, tuple(_param(p) for p in m.group(2).split(",")))
    return out


def kinds_by_entry() -> dict[str, tuple[str, tuple[str, ...]]]:
    """{entry: (module, (kind, ...))} over the shipped and the test-only kernels."""
    both = {**in_sources(KERNEL_DIR), **in_sources(TEST_KERNEL_DIR)}
    return {e: (mod, tuple(p.kind for p in ps)) for e, (mod, ps) in both.items()}


def table_mismatches(folder: Path, kernels) -> list[str]:
    """A family's kernel table (Kernel entries) against the .cu sources of its folder: every
    entry of the sources in the table and back, each in its module, with its parameters'
    names and kinds in order."""
    srcs = in_sources(folder)
    out = [f"{e}: in the sources, not the table" for e in sorted(set(srcs) - {k.entry for k in kernels})]
    for k in kernels:
        if k.entry not in srcs:
            out.append(f"{k.entry}: in the table, not the sources")
            continue
        module, params = srcs[k.entry]
        if module != k.module:
            out.append(f"{k.entry}: module {k.module} in the table, {module}.cu in the sources")
        if [(p.name, p.kind) for p in params] != [(p.split(":")[0], c) for p, c in zip(k.params, k.c_kinds())] \
                or len(params) != len(k.params):
            out.append(f"{k.entry}: parameters differ from the source's")
    return out
