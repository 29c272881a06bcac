"""The emulators' build: CUDA sources compiled for the host with g++ against stand-ins of the
device headers (tests/emu/host.h and a family's own), every file copied into one folder first so
that a source's `#include "common.cuh"` finds the stand-in, not the real header; the library
loaded with ctypes. A module's tests skip where there is no g++."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

HOST = Path(__file__).resolve().parent / "host.h"  # what every host stand-in shares


def compile_host(tmp_path_factory, name: str, files, texts: dict[str, str] | None = None,
                 opt: str = "-O1") -> ctypes.CDLL:
    """NAME.cpp (among `files`, paths copied as they are, and `texts`, files written from
    strings) built with host.h beside them into a shared library."""
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip(f"no g++ to compile {name} for the host")
    d = tmp_path_factory.mktemp(name)
    for f in (HOST, *files):
        shutil.copy(f, d / Path(f).name)
    for fname, text in (texts or {}).items():
        (d / fname).write_text(text)
    lib = d / f"{name}.so"
    done = subprocess.run([gxx, "-std=c++20", opt, "-ffp-contract=off", "-shared", "-fPIC", "-pthread", f"-I{d}",
                           str(d / f"{name}.cpp"), "-o", str(lib)], capture_output=True, text=True)
    if done.returncode:
        pytest.fail(f"g++ failed on {name}.cpp:\n{done.stderr[-3000:]}")
    return ctypes.CDLL(str(lib))


def ptr(a: np.ndarray):
    """An array's data for a ctypes call."""
    return a.ctypes.data_as(ctypes.c_void_p)
