"""The Kimi-Linear CUDA kernels (sm_90a): kda.cu, mla.cu and route.cu, a cubin each, pinned in
cubins.sha256 and shipped in cubins/ (kern_models.common.cubins builds and pins them); table.py
types every kernel, KERNELS.md says what each computes. The dense parts are the llama family's
kernels, the experts the Qwen3-MoE family's."""

from __future__ import annotations

from pathlib import Path

from kern_models.common.cubins import Cubins

from .table import ARCH, TILES

CUBINS = Cubins(Path(__file__).resolve().parent, ARCH, TILES)
