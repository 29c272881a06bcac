"""The device layer on the GPU: copies, graph replay equal to eager launches bit for bit,
cooperative and PDL launches, the virtual-address pool, cuBLASLt GEMM."""

import numpy as np
import pytest

from kern.runtime.devices.cuda import memory
from kern.runtime.devices.cuda.graphs import capture
from tests.cuda import cuda_refs as R
from tests.cuda.cuda_gpu import launch_all
from tests.cuda.cuda_refs import BF16

pytestmark = pytest.mark.gpu


def test_copies_and_memset(gpu):
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, 1 << 20, dtype=np.uint8)
    da, db = gpu.put(a), gpu.empty(a.nbytes)
    memory.copy_device(db.ptr, da.ptr, a.nbytes, gpu.stream)
    assert np.array_equal(gpu.get(db, np.uint8, a.shape), a)
    memory.memset(db.ptr + 100, 7, 50, gpu.stream)
    b = a.copy()
    b[100:150] = 7
    assert np.array_equal(gpu.get(db, np.uint8, a.shape), b)


def _decode_step(gpu, rng, vocab=32000, hidden=1024, rows=2, chunks=128):
    """embed -> rms_norm -> LM head (gemv_f32) -> argmax: buffers and the launch list."""
    W = R.rand_bf16(rng, (vocab, hidden))
    b = dict(ids=gpu.put(rng.integers(0, vocab, rows).astype(np.int32)), W=gpu.put(W),
             norm_w=gpu.put(R.rand_bf16(rng, (hidden,))), x=gpu.empty(rows * hidden * 2),
             y=gpu.empty(rows * hidden * 2), logits=gpu.empty(rows * vocab * 4),
             pv=gpu.empty(rows * chunks * 4), pi=gpu.empty(rows * chunks * 4), tok=gpu.empty(rows * 4),
             temp=gpu.put(np.zeros(rows, np.float32)), key=gpu.put(np.zeros((rows, 2), np.int32)),
             mask=gpu.put(np.zeros((1, -(-vocab // 32)), np.int32)), mask_row=gpu.put(np.zeros(rows, np.int32)))

    def launches(pdl=False):
        return [
            gpu.make("embed", rows, 256, b["ids"], b["W"], b["x"], rows, hidden, pdl=pdl),
            gpu.make("rms_norm", rows, 256, b["x"], b["norm_w"], b["y"], rows, hidden, 1e-5, pdl=pdl),
            gpu.make("gemv_f32", -(-vocab // 8), 256, b["y"], b["W"], b["logits"], rows, vocab, hidden, pdl=pdl),
            gpu.make("sample_partial", (chunks, rows), 256, b["logits"], b["temp"], b["key"], b["mask"], b["mask_row"],
                     b["pv"], b["pi"], vocab, rows, chunks, pdl=pdl),
            gpu.make("argmax_final", rows, 32, b["pv"], b["pi"], b["tok"], rows, chunks, pdl=pdl),
        ]

    def outputs():
        return (gpu.get(b["logits"], np.float32, (rows, vocab)).tobytes(),
                gpu.get(b["tok"], np.int32, rows).tolist())

    def poison():
        for k in ("x", "y", "logits", "pv", "pi", "tok"):
            memory.memset(b[k].ptr, 0xFF, b[k].nbytes, gpu.stream)

    return b, launches, outputs, poison


def test_a_staged_input_is_copied_up_inside_the_graph_that_reads_it(gpu):
    """Inputs are written into a pinned mirror; the program's graph starts with the copy up, so
    a new step's inputs need no copy call: write the mirror, replay."""
    rng = np.random.default_rng(3)
    vocab, hidden, rows = 512, 256, 3
    W = R.rand_bf16(rng, (vocab, hidden))
    dW, out = gpu.put(W), gpu.empty(rows * hidden * 2)
    ids_dev = gpu.empty(rows * 4)
    ids = memory.StagedBuffer(ids_dev, memory.PinnedHost(ids_dev.nbytes, "ids"))
    step = [gpu.make("embed", rows, 256, ids.ptr, dW, out, rows, hidden)]
    g = capture(gpu.stream, lambda: (ids.upload(gpu.stream), launch_all(step, gpu.stream)), label="staged")
    try:
        for _ in range(3):
            want = rng.integers(0, vocab, rows).astype(np.int32)
            ids.host.array[:] = want.view(np.uint8)  # only the mirror is written
            g.replay(gpu.stream)
            got = gpu.get(out, BF16, (rows, hidden))
            assert np.array_equal(got.view(np.uint16), W[want].view(np.uint16))
    finally:
        g.destroy()
        ids.host.free()


def test_graph_replay_is_bitwise_equal_to_eager_launches(gpu):
    rng = np.random.default_rng(1)
    b, launches, outputs, poison = _decode_step(gpu, rng)
    launch_all(launches(), gpu.stream)
    eager = outputs()
    logits = np.frombuffer(eager[0], np.float32).reshape(len(eager[1]), -1)
    assert eager[1] == logits.argmax(axis=1).tolist()  # greedy (temperature 0): the row's argmax
    plain = capture(gpu.stream, lambda: launch_all(launches(), gpu.stream), label="decode")
    pdl = capture(gpu.stream, lambda: launch_all(launches(pdl=True), gpu.stream), label="decode-pdl")
    for _ in range(3):
        poison()
        plain.replay(gpu.stream)
        assert outputs() == eager
    # new inputs at the same addresses: the replay follows them
    new_ids = rng.integers(0, 32000, 2).astype(np.int32)
    memory.copy_to_device(b["ids"].ptr, new_ids)
    poison()
    launch_all(launches(), gpu.stream)
    eager2 = outputs()
    poison()
    plain.replay(gpu.stream)
    assert outputs() == eager2
    # programmatic dependent launch, eager and captured: same bits
    poison()
    launch_all(launches(pdl=True), gpu.stream)
    assert outputs() == eager2
    poison()
    pdl.replay(gpu.stream)
    assert outputs() == eager2
    plain.destroy()
    pdl.destroy()


def test_cooperative_launch(gpu):
    rng = np.random.default_rng(2)
    b, launches, outputs, poison = _decode_step(gpu, rng)
    launch_all(launches(), gpu.stream)
    eager = outputs()
    # every launch but the LM head (4000 blocks cannot all be resident at once) is cooperative
    coop = [l if l.kernel.name == "gemv_f32" else
            gpu.make(l.kernel.name, l.grid, l.block, *l.args, cooperative=True) for l in launches()]
    assert sum(l.cooperative for l in coop) == 4
    poison()
    launch_all(coop, gpu.stream)
    assert outputs() == eager


def test_virtual_pool_maps_moves_and_unmaps_chunks(gpu):
    from kern.runtime.devices.cuda.vmm import PhysicalChunks, VirtualPool, granularity
    g = granularity(gpu.device)
    assert g > 0
    chunks = PhysicalChunks(gpu.device, g, 3)
    pool = VirtualPool(gpu.device, n_slots=4, chunks=chunks)
    other = VirtualPool(gpu.device, n_slots=2, chunks=chunks)  # another state's range over the same chunks
    try:
        pool.apply(map=[(0, 0), (1, 1), (2, 3)])
        rng = np.random.default_rng(3)
        a = rng.integers(0, 256, g, dtype=np.uint8)
        memory.copy_to_device(pool.address(0), a)
        # a kernel reads from and writes into mapped memory
        vocab, hidden = 64, 1024
        W = R.rand_bf16(rng, (vocab, hidden))
        memory.copy_to_device(pool.address(1), W)
        ids = gpu.put(np.array([5, 63, 0], np.int32))
        gpu.run("embed", 3, 256, ids, pool.address(1), pool.address(3), 3, hidden)
        out = memory.copy_to_host(np.empty((3, hidden), BF16), pool.address(3))
        assert np.array_equal(out.view(np.uint16), W[[5, 63, 0]].view(np.uint16))
        # move chunk 0 from slot 0 to slot 2: its bytes follow it
        pool.apply(unmap=[0], map=[(0, 2)])
        assert np.array_equal(memory.copy_to_host(np.empty(g, np.uint8), pool.address(2)), a)
        assert pool.chunk_at == {1: 1, 2: 0, 3: 2}
        with pytest.raises(ValueError, match="slot already mapped"):
            pool.apply(map=[(0, 1)])
        with pytest.raises(ValueError, match="slot 0 is not mapped"):
            pool.apply(unmap=[0])
        # a chunk moves to the other range, bytes and all (a remap from pages to slots, no copy)
        with pytest.raises(ValueError, match="chunk already mapped"):
            other.apply(map=[(0, 1)])
        pool.apply(unmap=[2])
        other.apply(map=[(0, 1)])
        assert np.array_equal(memory.copy_to_host(np.empty(g, np.uint8), other.address(1)), a)
    finally:
        pool.release()
        other.release()
        chunks.release()


@pytest.mark.parametrize("M,N,K", [(1, 384, 512), (64, 1000, 2048), (200, 2048, 576)])
def test_cublaslt_bf16_tn_gemm(gpu, M, N, K):
    from kern.runtime.devices.cuda.cublaslt import CublasLt
    lt = CublasLt()
    print("libcublasLt:", lt.path)
    rng = np.random.default_rng(4)
    x, W = R.rand_bf16(rng, (M, K)), R.rand_bf16(rng, (N, K), 0.05)
    dy = gpu.empty(M * N * 2)
    lt.gemm_bf16_tn(gpu.put(x).ptr, gpu.put(W).ptr, dy.ptr, M, N, K, gpu.stream)
    y = R.f32(gpu.get(dy, BF16, (M, N)))
    ref = R.f32(x).astype(np.float64) @ R.f32(W).astype(np.float64).T
    bound = np.abs(R.f32(x)).astype(np.float64) @ np.abs(R.f32(W)).astype(np.float64).T
    assert not np.isnan(y).any()
    assert np.all(np.abs(y - ref) <= 2.0**-8 * np.abs(ref) + 1e-5 * bound + 1e-6)
