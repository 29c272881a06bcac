"""sample_partial under a token mask (mask_row > 0) on the GPU: the cpu op's token for every greedy
row (ties, NaN, -inf, +inf, dead rows, a mask allowing nothing), the host path's token where a
token is allowed, and the unmasked draw for the same key where the mask allows it.

    python -m pytest -q tests/cuda/test_cuda_gpu_mask.py   (on the H200)"""

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


def _pack(allowed: np.ndarray) -> np.ndarray:
    rows, vocab = allowed.shape
    bits = np.zeros((rows, -(-vocab // 32) * 32), np.uint8)
    bits[:, :vocab] = allowed
    return np.packbits(bits, axis=1, bitorder="little").view("<i4")


def _rows(n: int, vocab: int, seed: int):
    rng = np.random.default_rng(seed)
    z = rng.integers(-3, 4, (n, vocab)).astype(np.float32)  # small integers: ties across chunks
    z[rng.random(z.shape) < 0.05] = np.nan
    z[rng.random(z.shape) < 0.05] = -np.inf
    z[rng.random(z.shape) < 0.001] = np.inf
    allowed = rng.random(z.shape) < rng.choice([0.0005, 0.01, 0.3, 1.0], (n, 1))
    dead = rng.choice(n, n // 8, replace=False)
    z[dead] = np.where(allowed[dead], rng.choice([-np.inf, np.nan], (len(dead), vocab)), z[dead])
    allowed[rng.choice(n, 2, replace=False)] = False  # a mask allowing nothing: token 0
    return z, allowed


def _draw(gpu, z, allowed, temps, keys, masked, chunks=128):
    n, vocab = z.shape
    pv, pi, tok = gpu.empty(n * chunks * 4), gpu.empty(n * chunks * 4), gpu.empty(n * 4)
    rows = np.where(masked, np.arange(1, n + 1), 0).astype(np.int32)
    gpu.run("sample_partial", (chunks, n), 256, gpu.put(z), gpu.put(temps.astype(np.float32)), gpu.put(keys),
            gpu.put(_pack(allowed)), gpu.put(rows), pv, pi, vocab, n, chunks)
    gpu.run("argmax_final", n, 32, pv, pi, tok, n, chunks)
    return gpu.get(tok, np.int32, n)


def _cpu(z, allowed, temps, keys, masked):
    from kern_models.llama.kernels.cpu.kernels import sample

    out = np.empty(len(z), np.int32)
    rows = np.where(masked, np.arange(1, len(z) + 1), 0).astype(np.int32)
    sample(z, temps.astype(np.float32), keys, _pack(allowed), rows, out)
    return out


def test_a_masked_greedy_row_gets_the_cpu_ops_and_the_host_paths_token(gpu):
    from kern.generation import SamplingParams
    from kern.generation.sampling import sample as host_sample

    n, vocab = 96, 50021
    z, allowed = _rows(n, vocab, 0)
    zeros, keys, every = np.zeros(n), np.zeros((n, 2), np.int32), np.ones(n, bool)
    got = _draw(gpu, z, allowed, zeros, keys, every)
    assert got.tolist() == _cpu(z, allowed, zeros, keys, every).tolist()
    host = host_sample(z, [SamplingParams()] * n, [None] * n, [[]] * n, [[]] * n, allowed)[0]
    some = allowed.any(axis=1)
    assert [int(g) for g, ok in zip(got, some) if ok] == [h for h, ok in zip(host, some) if ok]
    assert (got[~some] == 0).all()


def test_a_masked_sampled_row_draws_the_unmasked_draw_where_the_mask_allows_it(gpu):
    rng = np.random.default_rng(4)
    n, vocab = 256, 50021
    z = (rng.standard_normal((n, vocab)) * 3).astype(np.float32)
    temps = np.where(np.arange(n) % 2, 0.8, 0.0)
    keys = rng.integers(-2**31, 2**31, (n, 2)).astype(np.int32)
    every = np.ones((n, vocab), bool)
    free = _draw(gpu, z, every, temps, keys, np.zeros(n, bool))
    assert _draw(gpu, z, every, temps, keys, np.ones(n, bool)).tolist() == free.tolist()
    some = rng.random((n, vocab)) < 0.2
    some[np.arange(n), free] = True
    assert _draw(gpu, z, some, temps, keys, np.ones(n, bool)).tolist() == free.tolist()
    cpu = _cpu(z, some, temps, keys, np.ones(n, bool))
    assert np.mean(cpu != free) < 0.01  # one formula; a flip needs a near-tie of logit / T + noise


def test_masked_rows_beside_unmasked_ones_keep_their_own_draws(gpu):
    """mask_row picks each row's words: rows 0, 2 masked by words rows 0 and 1, row 1 free."""
    n, vocab = 3, 4099
    z = np.random.default_rng(5).standard_normal((n, vocab)).astype(np.float32)
    allowed = np.zeros((2, vocab), bool)
    allowed[0, [7, 4000]] = True
    allowed[1, [4098]] = True
    pv, pi, tok = gpu.empty(n * 128 * 4), gpu.empty(n * 128 * 4), gpu.empty(n * 4)
    gpu.run("sample_partial", (128, n), 256, gpu.put(z), gpu.put(np.zeros(n, np.float32)),
            gpu.put(np.zeros((n, 2), np.int32)), gpu.put(_pack(allowed)), gpu.put(np.array([1, 0, 2], np.int32)),
            pv, pi, vocab, n, 128)
    gpu.run("argmax_final", n, 32, pv, pi, tok, n, 128)
    got = gpu.get(tok, np.int32, n).tolist()
    assert got == [[7, 4000][int(np.argmax(z[0, [7, 4000]]))], int(np.argmax(z[1])), 4098]
