"""How many threads numpy's BLAS runs on while kern test judges: one.

Two reasons. OpenBLAS's results depend on its thread count (a 6 x 576 by 576 x 1536 product
differs in its last bits between one thread and two), so a cpu side's numbers, and a verdict
near a floor, would depend on the machine's cores; on one thread they do not. And a cpu
reference's work is spread over forked processes (forked.py): several processes each running
OpenBLAS's full pool on the same cores fight (a record that took 2 s alone took 16 s beside
three such children on two cores), while the calls are small matrices that one thread serves
nearly as well. numpy exposes no setter: the library it loaded is found in the process's maps and
its own entry point called; where there is none (another BLAS, another platform) the count stays
as it was."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache

# numpy >= 2 wheels (scipy-openblas, 64-bit ints), numpy 1.x wheels, a system OpenBLAS
_NAMES = (("scipy_openblas_set_num_threads64_", "scipy_openblas_get_num_threads64_"),
          ("openblas_set_num_threads64_", "openblas_get_num_threads64_"),
          ("openblas_set_num_threads", "openblas_get_num_threads"))


@cache
def _entry() -> tuple | None:
    import numpy  # noqa: F401 - loads its BLAS, so that it is in the maps

    try:
        with open("/proc/self/maps") as f:
            paths = sorted({ln.split()[-1] for ln in f if "openblas" in ln.split()[-1].lower()})
    except OSError:
        return None
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for set_name, get_name in _NAMES:
            if hasattr(lib, set_name) and hasattr(lib, get_name):
                setter, getter = getattr(lib, set_name), getattr(lib, get_name)
                setter.argtypes, getter.restype = [ctypes.c_int], ctypes.c_int
                return setter, getter
    return None


@contextmanager
def threads(n: int) -> Iterator[None]:
    """BLAS on n threads inside, as it was after."""
    e = _entry()
    if e is None:
        yield
        return
    before = e[1]()
    e[0](n)
    try:
        yield
    finally:
        e[0](before)
