"""The emulated kernels' build (test_kda_tc_emulated.py, test_mla_tc_emulated.py): an emulator
emu/NAME.cpp compiled for the host with g++ together with the kernel sources it includes, all
copied beside the stand-in emu/common.cuh first (so a shared header's `#include "common.cuh"`
finds the stand-in, not the real one), loaded with ctypes; the module's tests skip without g++."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
EMU = Path(__file__).resolve().parent / "emu"
HOST = ROOT / "tests" / "emu" / "host.h"  # what every host stand-in shares


def build_emulator(tmp_path_factory, name: str, *sources: str) -> ctypes.CDLL:
    """emu/NAME.cpp built with `sources` (paths from the repository root) beside it."""
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip(f"no g++ to compile {name} for the host")
    d = tmp_path_factory.mktemp(name)
    for f in (HOST, EMU / "common.cuh", EMU / "grid.h", EMU / f"{name}.cpp", *(ROOT / s for s in sources)):
        shutil.copy(f, d / f.name)
    lib = d / f"{name}.so"
    done = subprocess.run([gxx, "-std=c++20", "-O1", "-ffp-contract=off", "-shared", "-fPIC", "-pthread", f"-I{d}",
                           str(d / f"{name}.cpp"), "-o", str(lib)], capture_output=True, text=True)
    if done.returncode:
        pytest.fail(f"g++ failed on {name}.cpp:\n{done.stderr[-3000:]}")
    return ctypes.CDLL(str(lib))


def ptr(a: np.ndarray):
    """An array's data for a ctypes call."""
    return a.ctypes.data_as(ctypes.c_void_p)
