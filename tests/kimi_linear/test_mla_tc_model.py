"""The numpy model of mla_tc.cu's order (mla_tc_model.py), on the CPU: it matches float64 absorbed
attention within bf16's rounding at the real width and at the tiny models' (where a warp's run
of the scores is short or empty and a tile is partly past the context), and a row's result does
not depend on which rows share its mma tile or where in the tile it sits (the kernel's packing
freedom, prefill's groups against decode's); a row whose keys span several chunks (the split:
keys cut in chunks of `chunk` from key 0, each chunk's (m, l, acc) folded in order) matches
float64 as well, and gets the same bits whole (a prefill block walking its chunks), decoded (a
block a chunk, the partials folded by the last to finish, whatever order they finished in) or
with its chunks' partials computed beside other rows; a row of one chunk gets the unsplit
order's bits (acc / l). The bits on the H200 are the GPU tests' to check
(test_cuda_gpu_mla_tc.py)."""

from __future__ import annotations

import numpy as np
import pytest

from . import mla_tc_model as M


def _case(kv_lora, rope, nope, heads, ctx, seed):
    rng = np.random.default_rng(seed)
    width = kv_lora + rope
    keys = M.from_bits(M.bf16_bits(rng.standard_normal((ctx, width)).astype(np.float32)))
    q = (rng.standard_normal((heads, width)) * 0.6).astype(np.float32)
    return keys, q


# (kv_lora, rope, nope): the real model's, the small and tiny random checkpoints'
@pytest.mark.parametrize("kv_lora,rope,nope", [(512, 64, 128), (128, 32, 32), (32, 16, 16)])
@pytest.mark.parametrize("ctx", [1, 31, 33, 100])
def test_the_model_matches_float64_attention_within_bf16_rounding(kv_lora, rope, nope, ctx):
    keys, q = _case(kv_lora, rope, nope, 16, ctx, kv_lora + ctx)
    got = M.model_group(q, keys, ctx, kv_lora, nope, rope)
    for h in range(16):
        want = M.reference(M.bf16_round(q[h]), keys[:ctx], kv_lora, nope, rope)
        err = np.abs(got[h] - want)
        assert err.max() < 1e-2 * max(1.0, np.abs(want).max()), (h, err.max())
        # against the unrounded query too: what rounding q_lat to bf16 costs
        assert np.abs(got[h] - M.reference(q[h], keys[:ctx], kv_lora, nope, rope)).max() < 3e-2


def test_a_row_gets_the_same_bits_however_rows_are_packed():
    """20 heads of one position: as decode packs them (heads 0-15, 16-19 + padding) and
    shuffled (any packing a prefill block might use), each head's result to the bit."""
    kv_lora, rope, nope, ctx = 128, 32, 32, 45
    keys, q = _case(kv_lora, rope, nope, 20, ctx, 7)
    ctxs = np.full(20, ctx)
    plain = M.model_rows(q, lambda i: keys, ctxs, kv_lora, nope, rope)
    for seed in range(3):
        order = np.random.default_rng(seed).permutation(20)
        assert np.array_equal(M.model_rows(q, lambda i: keys, ctxs, kv_lora, nope, rope, order), plain)


def test_keys_past_the_context_do_not_reach_a_row():
    """The kernel walks whole tiles: what lies past a row's context (stale cache rows, here huge)
    must not change its bits."""
    kv_lora, rope, nope, ctx = 32, 16, 16, 40
    keys, q = _case(kv_lora, rope, nope, 16, 64, 3)
    want = M.model_group(q, keys, ctx, kv_lora, nope, rope)
    keys[ctx:] = 1e30
    assert np.array_equal(M.model_group(q, keys, ctx, kv_lora, nope, rope), want)


def test_the_cache_reads_the_pages_mla_row_addresses():
    rng = np.random.default_rng(0)
    c = M.Cache(rng, [40, 17], 32, 16)
    per_page = c.page_tokens * c.token_bytes // 2
    s, t, layer = 1, 16, 1  # the first token of the sequence's second page
    row = int(c.table[s, 1]) * per_page + (layer * c.page_tokens + 0) * c.width
    assert np.array_equal(c.tokens(s, layer, 17)[t], M.from_bits(c.bits[row:row + c.width]))


# (kv_lora, rope, nope, chunk, ctx): several chunks, the last one partial or whole, a partial tile
@pytest.mark.parametrize("kv_lora,rope,nope,chunk,ctx", [(512, 64, 128, 64, 200), (128, 32, 32, 32, 97),
                                                         (32, 16, 16, 64, 256), (32, 16, 16, 96, 300)])
def test_a_row_over_several_chunks_matches_float64_attention(kv_lora, rope, nope, chunk, ctx):
    keys, q = _case(kv_lora, rope, nope, 16, ctx, ctx + chunk)
    got = M.model_group(q, keys, ctx, kv_lora, nope, rope, chunk)
    assert len(M.chunks(ctx, chunk)) > 1
    for h in range(16):
        want = M.reference(M.bf16_round(q[h]), keys[:ctx], kv_lora, nope, rope)
        assert np.abs(got[h] - want).max() < 1e-2 * max(1.0, np.abs(want).max()), h


def test_a_row_whole_decoded_or_cut_gets_the_same_bits():
    """Prefill's walk (model_group: chunk by chunk, folded as it goes) against decode's split
    (a partial a chunk, computed in any order, folded in chunk order), for every position of a
    prompt that crosses 4 chunk boundaries: to the bit. A row's chunks are fixed by its own
    keys (from key 0), so where the prompt was cut cannot move them."""
    kv_lora, rope, nope, chunk = 32, 16, 16, 64
    n = 4 * chunk + 17
    keys, _ = _case(kv_lora, rope, nope, 16, n, 11)
    rng = np.random.default_rng(5)
    qs = (rng.standard_normal((n, 16, kv_lora + rope)) * 0.6).astype(np.float32)
    for pos in (0, 31, 63, 64, 65, 127, 128, 200, n - 1):
        ctx = pos + 1
        whole = M.model_group(qs[pos], keys, ctx, kv_lora, nope, rope, chunk)
        spans = M.chunks(ctx, chunk)
        parts = {z: M.model_partial(qs[pos], keys, ctx, kv_lora, nope, rope, *spans[z])
                 for z in rng.permutation(len(spans))}
        decoded = M.model_fold(parts[z] for z in range(len(spans)))
        assert np.array_equal(decoded, whole), pos
        # stale keys past the context (a decode block's tile past pos) reach neither
        poisoned = keys.copy()
        poisoned[ctx:] = 1e30
        assert np.array_equal(M.model_group(qs[pos], poisoned, ctx, kv_lora, nope, rope, chunk), whole), pos


def test_a_row_of_one_chunk_keeps_the_unsplit_order():
    """The fold of one chunk from (-inf, 0, 0) is exact (co = 0, cz = 1): o = acc / l, the bits
    mla_tc.cu gave before the split, so short contexts keep their bits and their one launch."""
    kv_lora, rope, nope, ctx = 128, 32, 32, 100
    keys, q = _case(kv_lora, rope, nope, 16, ctx, 2)
    m, l, acc = M.model_partial(q, keys, ctx, kv_lora, nope, rope, 0, ctx)
    assert np.array_equal(M.model_group(q, keys, ctx, kv_lora, nope, rope, 2048), (acc / l[:, None]).astype(np.float32))
    assert np.array_equal(M.model_group(q, keys, ctx, kv_lora, nope, rope, 128), (acc / l[:, None]).astype(np.float32))


def test_the_chunk_is_part_of_the_order():
    """Another chunk size folds at other keys: other bits (within rounding), which is why the
    chunk is a deployment constant (manifests/cuda.py MLA_CHUNK), never chosen per batch."""
    kv_lora, rope, nope, ctx = 32, 16, 16, 256
    keys, q = _case(kv_lora, rope, nope, 16, ctx, 9)
    a = M.model_group(q, keys, ctx, kv_lora, nope, rope, 64)
    b = M.model_group(q, keys, ctx, kv_lora, nope, rope, 128)
    assert not np.array_equal(a, b)
    assert np.abs(a - b).max() < 1e-3


def test_split_rows_packed_any_way_get_the_same_bits():
    """20 heads of one position over 3 chunks, packed as decode packs them and shuffled."""
    kv_lora, rope, nope, ctx, chunk = 32, 16, 16, 150, 64
    keys, q = _case(kv_lora, rope, nope, 20, ctx, 8)
    ctxs = np.full(20, ctx)
    plain = M.model_rows(q, lambda i: keys, ctxs, kv_lora, nope, rope, chunk=chunk)
    for seed in range(2):
        order = np.random.default_rng(seed).permutation(20)
        assert np.array_equal(M.model_rows(q, lambda i: keys, ctxs, kv_lora, nope, rope, order, chunk), plain)
