"""gemm_wg.cuh (the many-row projections every family's wgmma kernels run) on the CPU, bit for bit
against a numpy model of its order: the source compiled with g++ against host stand-ins of
wgmma, mbarriers, cp.async and the cluster (tests/cuda/emu_wg: each thread a std::thread, a
tile's split blocks at once), the k16 step's sum taken as the model takes it (the accumulator and
16 exact products added in double, rounded once to f32). So what is checked is the kernel's
indexing and order, not the tensor core's arithmetic: the units of 256 dealt to 8 partials, each
partial's k16 steps chained, the partials added in order, unsplit or split over 8 blocks (the
wide decode's), either producer, plain and paired outputs (wg_store's two layouts), rows and K off the tiles.
The real source is copied with its three device-only statements (the dynamic shared memory's
declaration, two PTX fences) replaced. Both producers are run: cp.async (by address) and the
tensor memory access unit's boxes (gemm.cu's entries: the box copied at once, swizzled, its bytes
counted on the stage's barrier)."""

from __future__ import annotations

import resource
from pathlib import Path

import numpy as np
import pytest

from tests.emu.build import compile_host, ptr

ROOT = Path(__file__).resolve().parents[2]
EMU = Path(__file__).resolve().parent / "emu_wg"
SOURCE = ROOT / "models" / "common" / "cuda" / "gemm_wg.cuh"
# the device-only statements of gemm_wg.cuh and their stand-ins
EDITS = [("extern __shared__ char wg_smem_raw[];", "char *wg_smem_raw = emu_smem_base();"),
         ('asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");', ";"),
         ('asm volatile("cp.async.wait_all;" ::: "memory");', ";")]


@pytest.fixture(scope="module")
def emu(tmp_path_factory):
    soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    if soft != resource.RLIM_INFINITY and soft < 4096:  # a split tile's 8 blocks run as 2,048 threads at once
        pytest.skip(f"the host allows {soft} threads: the emulated cluster needs 2,048 at once")
    text = SOURCE.read_text()
    for old, new in EDITS:
        assert old in text, f"gemm_wg.cuh no longer holds {old!r}: the emulator's edit is stale"
        text = text.replace(old, new)
    return compile_host(tmp_path_factory, "wg_emu", list(EMU.iterdir()), {"gemm_wg_host.cuh": text}, opt="-O2")


def _bf16(rng, shape, scale):
    """Random bf16 values (their bits, and the same values as float64)."""
    f = (rng.standard_normal(shape) * scale).astype(np.float32)
    bits = ((f.view(np.uint32) + 0x7FFF + ((f.view(np.uint32) >> 16) & 1)) >> 16).astype(np.uint16)
    return bits, (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def model(x: np.ndarray, W: np.ndarray, K: int) -> np.ndarray:
    """y [rows, N] f32 in gemm_wg's order (x, W float64 holding bf16 values)."""
    nu = -(-K // 256)
    xp = np.zeros((x.shape[0], nu * 256)), np.zeros((W.shape[0], nu * 256))
    xp[0][:, :K], xp[1][:, :K] = x, W
    tot = np.zeros((x.shape[0], W.shape[0]), np.float32)
    for p in range(8):
        acc = None
        for u in range(p, nu, 8):
            for s in range(16):
                k0 = 256 * u + 16 * s
                s64 = np.zeros(tot.shape) if acc is None else acc.astype(np.float64)
                for k in range(k0, k0 + 16):
                    s64 += xp[0][:, k, None] * xp[1][None, :, k]
                acc = s64.astype(np.float32)
        if acc is not None:
            tot = tot + acc
    return tot


# (rows, N, K): K of a partial unit (576: 3 units, partials 3-7 empty; 200: less than one), one
# unit a partial (2048), rows past one 64-row tile and N past one column tile, off their edges.
# K is a multiple of 8, as every caller's (a 16-byte copy of a row never reaches the next row)
SHAPES = [(5, 200, 576), (70, 136, 2048), (1, 128, 200)]


@pytest.mark.parametrize("tma", [0, 1], ids=["cp.async", "tma"])
@pytest.mark.parametrize("split", [0, 1], ids=["unsplit", "split"])
@pytest.mark.parametrize("rows,N,K", SHAPES)
def test_plain_outputs_are_the_models_bits(emu, rows, N, K, split, tma):
    rng = np.random.default_rng(rows + N + K)
    xb, x = _bf16(rng, (rows, K), 2.0)
    wb, W = _bf16(rng, (N, K), 0.05)
    y = np.full((rows, N), np.nan, np.float32)
    emu.wg_plain(ptr(xb), ptr(wb), ptr(y), rows, N, K, split, tma)
    want = model(x, W, K)
    assert np.array_equal(y.view(np.uint32), want.view(np.uint32)), \
        f"{int((y.view(np.uint32) != want.view(np.uint32)).sum())} of {y.size} outputs differ"


@pytest.mark.parametrize("tma", [0, 1], ids=["cp.async", "tma"])
@pytest.mark.parametrize("split", [0, 1], ids=["unsplit", "split"])
@pytest.mark.parametrize("rows,N,K", [(5, 100, 576), (70, 72, 2048)])
def test_paired_outputs_are_the_models_bits(emu, rows, N, K, split, tma):
    """Pair q's two sums (W rows q and N + q), each in its own output."""
    rng = np.random.default_rng(7 + rows + N)
    xb, x = _bf16(rng, (rows, K), 2.0)
    wb, W = _bf16(rng, (2 * N, K), 0.05)
    y0, y1 = (np.full((rows, N), np.nan, np.float32) for _ in range(2))
    emu.wg_pair(ptr(xb), ptr(wb), ptr(y0), ptr(y1), rows, N, K, split, tma)
    want = model(x, W, K)
    assert np.array_equal(y0.view(np.uint32), want[:, :N].view(np.uint32))
    assert np.array_equal(y1.view(np.uint32), want[:, N:].view(np.uint32))
