"""bf16 GEMM through cuBLASLt, called with ctypes: y[M, N] = x[M, K] @ W[N, K]^T.

"TN" in cuBLAS's column-major terms: A = W (transposed), B = x, D = y^T, fp32 accumulation
and scale, bf16 output (fp32 for logits). libcublasLt is opened on first use, searched in this order:
$KERN_CUBLASLT, the nvidia-cublas wheels on sys.path (cu13: nvidia/cu13/lib, cu12:
nvidia/cublas/lib), cuda-pathfinder, then the system (ldconfig, /usr/local/cuda).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import sys
from functools import cache
from typing import Any

from kern.runtime.devices.cuda.errors import CudaError, CudaUnavailable
from kern.runtime.devices.cuda.memory import DeviceBuffer, Stream, alloc

CUBLAS_COMPUTE_32F = 68
CUDA_R_32F, CUDA_R_16BF = 0, 14
CUBLAS_OP_N, CUBLAS_OP_T = 0, 1
DESC_TRANSA, DESC_TRANSB = 3, 4
PREF_MAX_WORKSPACE_BYTES = 1
WORKSPACE_BYTES = 32 << 20


class HeuristicResult(ctypes.Structure):
    _fields_ = [("algo", ctypes.c_uint64 * 8), ("workspaceSize", ctypes.c_size_t),
                ("state", ctypes.c_int), ("wavesCount", ctypes.c_float),
                ("reserved", ctypes.c_int * 4)]


def candidates() -> list[str]:
    """Where libcublasLt may be, most specific first."""
    out = [os.environ["KERN_CUBLASLT"]] if os.environ.get("KERN_CUBLASLT") else []
    for root in sys.path:
        for pattern in ("nvidia/cu13/lib/libcublasLt.so*", "nvidia/cublas/lib/libcublasLt.so*"):
            out += sorted(glob.glob(os.path.join(root or ".", pattern)), reverse=True)
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib
        out.append(load_nvidia_dynamic_lib("cublasLt").abs_path)
    except Exception:  # noqa: BLE001 - pathfinder is one optional place to look
        pass
    found = ctypes.util.find_library("cublasLt")
    out += [found] if found else []
    out += sorted(glob.glob("/usr/local/cuda*/lib64/libcublasLt.so*"), reverse=True)
    return [p for p in out if p]


@cache
def library() -> tuple[ctypes.CDLL, str]:
    """(the opened libcublasLt, its path)."""
    tried = []
    for path in candidates():
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            tried.append(f"{path}: {e}")
    raise CudaUnavailable(
        "cuBLASLt (libcublasLt.so) was not found: install the nvidia-cublas wheel "
        "(pip install 'kern-engine[cuda]') or the CUDA toolkit, or set KERN_CUBLASLT to the "
        "library's path" + ("; tried " + "; ".join(tried) if tried else ""))


def _check(status: int, fn: str, where: str = "") -> None:
    if status != 0:
        raise CudaError(fn, status, "cublasStatus", where)


class CublasLt:
    """A cuBLASLt handle with its workspace and per-shape plans (algorithm picked once per shape)."""

    def __init__(self) -> None:
        self.lib, self.path = library()
        handle = ctypes.c_void_p()
        _check(self.lib.cublasLtCreate(ctypes.byref(handle)), "cublasLtCreate")
        self.handle = handle
        self.workspace: DeviceBuffer = alloc(WORKSPACE_BYTES, "cublaslt workspace")
        self._plans: dict[tuple[int, int, int], tuple[Any, ...]] = {}

    def close(self) -> None:
        """Each plan's descriptors, the handle and the workspace given back (CudaDevice.close)."""
        for desc, a, b, c, pref, _result in self._plans.values():
            _check(self.lib.cublasLtMatmulPreferenceDestroy(pref), "cublasLtMatmulPreferenceDestroy")
            for lay in (a, b, c):
                _check(self.lib.cublasLtMatrixLayoutDestroy(lay), "cublasLtMatrixLayoutDestroy")
            _check(self.lib.cublasLtMatmulDescDestroy(desc), "cublasLtMatmulDescDestroy")
        self._plans.clear()
        if self.handle is not None:
            _check(self.lib.cublasLtDestroy(self.handle), "cublasLtDestroy")
            self.handle = None
        self.workspace.free()

    def _layout(self, rows: int, cols: int, ld: int, dtype: int = CUDA_R_16BF) -> ctypes.c_void_p:
        lay = ctypes.c_void_p()
        _check(self.lib.cublasLtMatrixLayoutCreate(ctypes.byref(lay), dtype,
               ctypes.c_uint64(rows), ctypes.c_uint64(cols), ctypes.c_int64(ld)),
               "cublasLtMatrixLayoutCreate")
        return lay

    def plan(self, M: int, N: int, K: int, out: int) -> tuple[Any, ...]:
        key = (M, N, K, out)
        if key in self._plans:
            return self._plans[key]
        lib, where = self.lib, _where(M, N, K, out)
        desc = ctypes.c_void_p()
        _check(lib.cublasLtMatmulDescCreate(ctypes.byref(desc), CUBLAS_COMPUTE_32F, CUDA_R_32F),
               "cublasLtMatmulDescCreate", where)
        for attr, op in ((DESC_TRANSA, CUBLAS_OP_T), (DESC_TRANSB, CUBLAS_OP_N)):
            v = ctypes.c_int32(op)
            _check(lib.cublasLtMatmulDescSetAttribute(desc, attr, ctypes.byref(v), ctypes.c_size_t(4)),
                   "cublasLtMatmulDescSetAttribute", where)
        a = self._layout(K, N, K)  # W [N, K] row-major = K x N column-major, used transposed
        b = self._layout(K, M, K)  # x [M, K] row-major = K x M column-major
        c = self._layout(N, M, N, out)  # y [M, N] row-major = N x M column-major
        pref = ctypes.c_void_p()
        _check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)),
               "cublasLtMatmulPreferenceCreate", where)
        ws = ctypes.c_uint64(WORKSPACE_BYTES)
        _check(lib.cublasLtMatmulPreferenceSetAttribute(pref, PREF_MAX_WORKSPACE_BYTES,
               ctypes.byref(ws), ctypes.c_size_t(8)), "cublasLtMatmulPreferenceSetAttribute", where)
        result, count = HeuristicResult(), ctypes.c_int(0)
        _check(lib.cublasLtMatmulAlgoGetHeuristic(self.handle, desc, a, b, c, c, pref, 1,
               ctypes.byref(result), ctypes.byref(count)), "cublasLtMatmulAlgoGetHeuristic", where)
        if count.value < 1:
            raise CudaError("cublasLtMatmulAlgoGetHeuristic", 0, "no algorithm", where)
        plan = (desc, a, b, c, pref, result)
        self._plans[key] = plan
        return plan

    def gemm_bf16_tn(self, x: int, w: int, y: int, M: int, N: int, K: int, stream: Stream,
                     out: int = CUDA_R_16BF) -> None:
        """y[M, N] = x[M, K] @ w[N, K]^T on `stream` (device addresses; bf16 in, fp32 accumulate,
        y in `out`: bf16, or fp32 for logits)."""
        desc, a, b, c, _pref, result = self.plan(M, N, K, out)
        alpha, beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
        stream_ptr = ctypes.c_void_p(int(stream.handle))
        _check(self.lib.cublasLtMatmul(
            self.handle, desc, ctypes.byref(alpha), ctypes.c_void_p(w), a, ctypes.c_void_p(x), b,
            ctypes.byref(beta), ctypes.c_void_p(y), c, ctypes.c_void_p(y), c,
            ctypes.byref(result.algo), ctypes.c_void_p(self.workspace.ptr),
            ctypes.c_size_t(WORKSPACE_BYTES), stream_ptr), "cublasLtMatmul", _where(M, N, K, out))


def _where(M: int, N: int, K: int, out: int) -> str:
    return f"bf16 TN GEMM M={M} N={N} K={K}" + (" (fp32 out)" if out == CUDA_R_32F else "")
