"""Tensor maps for Hopper's tensor memory access unit (TMA): a kernel param declared
`in buffer<dtype> tiles<R,C>` reads its view in boxes of R rows of C elements, and gets the
device address of a 128-byte CUtensorMap describing the view instead of the view's address.

A map is encoded once (cuTensorMapEncodeTiled through the driver's C entry point: its
arguments are plain integers and arrays, so ctypes needs nothing from cuda-bindings) and
copied to device memory before any launch or graph capture. The view is 2-D: its last
dimension the columns (contiguous), every row of the buffer from the view's offset on the rows,
so a map holds for every step whatever its row count (rows past a step's are read, never
stored by the kernels). A box of 128 bytes a row is 128-byte swizzled (the layout wgmma's
descriptors name); elements past the view's edge read as zero.
"""

from __future__ import annotations

import ctypes
from functools import cache

import numpy as np

from kern.manifest.schema import DTYPE_BYTES
from kern.runtime.devices.cuda import memory
from kern.runtime.devices.cuda.errors import CudaError
from kern.runtime.errors import DeviceError

MAP_BYTES = 128  # sizeof(CUtensorMap); device memory from cuMemAlloc is aligned far past its 64
# CUtensorMapDataType, CUtensorMapSwizzle, CUtensorMapL2promotion (cuda.h)
_DTYPES = {"bf16": 9, "f16": 6, "f32": 7}
_SWIZZLE = {32: 1, 64: 2, 128: 3}
_L2_256B = 3


@cache
def _encode_fn():
    lib = ctypes.CDLL("libcuda.so.1")
    f = lib.cuTensorMapEncodeTiled
    f.restype = ctypes.c_int
    f.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p,
                  ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint32),
                  ctypes.POINTER(ctypes.c_uint32), ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    return f


def encode_2d(ptr: int, rows: int, cols: int, dtype: str, box: tuple[int, int], where: str) -> bytes:
    """The 128 bytes of a tensor map over rows x cols elements at device address ptr (row-major),
    read in boxes of box = (rows, cols)."""
    esize = {"bf16": 2, "f16": 2, "f32": 4}[dtype]
    row_bytes = box[1] * esize
    if row_bytes not in _SWIZZLE or (cols * esize) % 16 or ptr % 16:
        raise CudaError("cuTensorMapEncodeTiled", 1, "CUDA_ERROR_INVALID_VALUE",
                        f"{where}: a box row of {row_bytes} bytes (32, 64 or 128), rows of {cols * esize} bytes "
                        "(a multiple of 16) at a 16-byte aligned address")
    out = np.zeros(MAP_BYTES // 8, np.uint64)
    dims = (ctypes.c_uint64 * 2)(cols, rows)
    strides = (ctypes.c_uint64 * 1)(cols * esize)
    boxd = (ctypes.c_uint32 * 2)(box[1], box[0])
    estr = (ctypes.c_uint32 * 2)(1, 1)
    err = _encode_fn()(out.ctypes.data, _DTYPES[dtype], 2, ptr, dims, strides, boxd, estr, 0,
                       _SWIZZLE[row_bytes], _L2_256B, 0)
    if err:
        raise CudaError("cuTensorMapEncodeTiled", err, f"CUresult {err}",
                        f"{where}: {rows} x {cols} {dtype} at {ptr:#x}, box {box[0]} x {box[1]}")
    return out.tobytes()


class TensorMaps:
    """The device copies of the maps a device's programs pass, one for each distinct view."""

    def __init__(self) -> None:
        self._maps: dict[tuple, memory.DeviceBuffer] = {}

    def address(self, ptr: int, rows: int, cols: int, dtype: str, box: tuple[int, int], where: str) -> int:
        key = (ptr, rows, cols, dtype, box)
        if key not in self._maps:
            buf = memory.alloc(MAP_BYTES, f"tensor map for {where}")
            memory.copy_to_device(buf.ptr, np.frombuffer(encode_2d(ptr, rows, cols, dtype, box, where), np.uint8))
            self._maps[key] = buf
        return self._maps[key].ptr

    def for_launches(self, launches, buffers: dict) -> dict[int, int]:
        """The map address of every tiled view the launches pass (by the view's id): columns its
        last dimension, rows every row of its buffer from its offset on, so one map serves every
        step's row count; the offset and that dimension must not depend on a var."""
        out = {}
        for l in launches:
            for v in l.args:
                if getattr(v, "tile", None) is None:
                    continue
                where = f"{l.where}, buffer {v.buffer!r}"
                if not isinstance(v.offset, int) or not isinstance(v.shape[-1], int):
                    raise DeviceError(f"{where}: read in tiles, so its view's offset and last dimension must not "
                                      "depend on a var")
                b, esize, cols = buffers[v.buffer], DTYPE_BYTES[v.dtype], v.shape[-1]
                rows = (b.nbytes // esize - v.offset) // cols
                out[id(v)] = self.address(b.ptr + v.offset * esize, rows, cols, v.dtype, v.tile, where)
        return out

    def free(self) -> None:
        for b in self._maps.values():
            b.free()
        self._maps.clear()
