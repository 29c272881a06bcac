"""The Qwen3-MoE CUDA kernels (sm_90a): moe.cu, one cubin, pinned in cubins.sha256 and shipped
in cubins/ (kern_models.common.cubins builds and pins it, with the tile defines of table.py);
table.py types every kernel, KERNELS.md says what each computes."""

from __future__ import annotations

from pathlib import Path

from kern_models.common.cubins import Cubins

from .table import ARCH, TILES

CUBINS = Cubins(Path(__file__).resolve().parent, ARCH, TILES)
