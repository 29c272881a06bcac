"""The Kimi-Linear CUDA kernels (sm_90a): kda.cu, kda_tc.cu, mla.cu, mla_tc.cu, route.cu and
linear.cu, a cubin each, pinned in cubins.sha256 and shipped in cubins/
(kern_models.common.cubins builds and pins them, with the defines of table.py); table.py types
every kernel, KERNELS.md says what each computes.
The dense parts are the llama family's kernels, the experts the Qwen3-MoE family's. linear.cu
includes llama's gemv.cuh (its k order is the one every row keeps), so llama's kernel folder is
on the include path and its headers are in the pins' inputs."""

from __future__ import annotations

from pathlib import Path

from kern_models.common.cubins import Cubins
from kern_models.llama.kernels.cuda import CUBINS as DENSE

from .table import ARCH, TILES

CUBINS = Cubins(Path(__file__).resolve().parent, ARCH, TILES, includes=(DENSE.folder,))
