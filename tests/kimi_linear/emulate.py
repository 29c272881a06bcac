"""The emulated kernels' build (test_kda_tc_emulated.py, test_mla_tc_emulated.py): an emulator
emu/NAME.cpp compiled for the host with g++ together with the kernel sources it includes, all
copied beside the stand-ins emu/common.cuh, emu/wgmma.cuh and emu/mla_wg.cuh first (so a shared
header's `#include "common.cuh"` finds the stand-in, not the real one), loaded with ctypes; the
module's tests skip without g++."""

from __future__ import annotations

import ctypes
from pathlib import Path

from tests.emu.build import compile_host

ROOT = Path(__file__).resolve().parents[2]
EMU = Path(__file__).resolve().parent / "emu"


def build_emulator(tmp_path_factory, name: str, *sources: str) -> ctypes.CDLL:
    """emu/NAME.cpp built with `sources` (paths from the repository root) beside it."""
    return compile_host(tmp_path_factory, name, (EMU / "common.cuh", EMU / "grid.h", EMU / "wgmma.cuh",
                                                 EMU / "mla_wg.cuh", EMU / f"{name}.cpp",
                                                 *(ROOT / s for s in sources)))
