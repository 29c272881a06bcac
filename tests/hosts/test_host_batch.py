"""vLLM's batch mapped onto the serving protocol (kern.hosts.batch), with vLLM's metadata faked
at its real shapes and dtypes (numpy): input_ids i32 and positions i64 a row (padded past the
batch), query_start_loc i32 [reqs + 1], seq_lens i32 [reqs], block_table i32 [reqs,
cdiv(max_model_len, block_size)]. The slices `sources` takes are what the plugin copies (the
same code slices torch tensors there)."""

from __future__ import annotations

import numpy as np
import pytest

from kern.hosts.batch import HostBatch, HostError, check_protocol, plan, sources
from kern.manifest.protocol import derive

MAX_MODEL_LEN = 1024
BLOCK = 16


def fake_vllm_batch(computed: list[int], scheduled: list[int], padded_rows: int = 0, seed: int = 0):
    """A step of vLLM's: sequence s has computed[s] tokens cached and scheduled[s] new rows."""
    rng = np.random.default_rng(seed)
    n = sum(scheduled)
    qsl = np.concatenate([[0], np.cumsum(scheduled)]).astype(np.int32)
    seq_lens = (np.array(computed) + np.array(scheduled)).astype(np.int32)
    width = -(-MAX_MODEL_LEN // BLOCK)
    table = np.zeros((len(scheduled), width), np.int32)
    free = rng.permutation(np.arange(1, 20_000, dtype=np.int32))  # block 0 is vLLM's null block
    for s, L in enumerate(seq_lens):
        k = -(-int(L) // BLOCK)
        table[s, :k], free = free[:k], free[k:]
    ids = rng.integers(0, 128256, n + padded_rows).astype(np.int32)
    pos = np.concatenate([np.arange(c, c + q) for c, q in zip(computed, scheduled)] + [np.zeros(padded_rows)])
    return qsl, HostBatch(ids, pos.astype(np.int64), table, seq_lens)


def replay(calls, b: HostBatch, width: int):
    """What each call's programs would read, and which call's logits each sequence keeps."""
    rows, logits_from = [], {}
    for i, call in enumerate(calls):
        src = sources(call, b, width)
        (r0, r1), (s0, s1) = call.rows, call.seqs
        assert src["token"].shape == (r1 - r0,) and src["position"].shape == (r1 - r0,)
        cu = call.cu_seqlens()
        assert cu[0] == 0 and cu[-1] == r1 - r0 and len(cu) == call.groups + 1
        for pt in call.stepper.page_tables:
            assert src[pt.buffer].shape == (s1 - s0, min(width, b.block_table.shape[1]))
        for g, p in enumerate(call.pieces):
            seq_rows = src["position"][cu[g]:cu[g + 1]]
            table = src[call.stepper.page_tables[0].buffer][g]
            # every row's page is the sequence's own (never the null block) and positions run on
            assert (table[seq_rows // BLOCK] > 0).all()
            rows.extend((p.seq, int(x)) for x in seq_rows)
        for s in range(s0, s1):  # the plugin copies the call's logits rows over [s0, s1)
            logits_from[s] = i
    return rows, logits_from


def test_a_mixed_step_is_one_ragged_call(verified_1b):
    p = derive(verified_1b)
    check_protocol(p)
    qsl, b = fake_vllm_batch([0, 100, 37, 500], [300, 1, 1, 64], padded_rows=13)
    calls = plan(p, np.diff(qsl), int(b.seq_lens.max()))
    assert [c.stepper.program for c in calls] == ["prefill"]
    assert calls[0].vars == {"prefill_seqs": 4, "tokens": 366, "mask_rows": 1}  # no row masked: the host samples
    rows, logits_from = replay(calls, b, 64)
    assert rows == [(s, int(x)) for s, c, q in zip(range(4), [0, 100, 37, 500], [300, 1, 1, 64])
                    for x in range(c, c + q)]
    assert logits_from == {0: 0, 1: 0, 2: 0, 3: 0}


@pytest.mark.parametrize("n, program", [(1, "decode"), (8, "decode"), (9, "decode_wide"), (256, "decode_wide")])
def test_a_decode_step_takes_the_fixed_rows_programs(verified_1b, n, program):
    p = derive(verified_1b)
    qsl, b = fake_vllm_batch(list(range(100, 100 + n)), [1] * n)
    calls = plan(p, np.diff(qsl), int(b.seq_lens.max()))
    assert [c.stepper.program for c in calls] == [program]
    assert calls[0].uniform and (calls[0].cu_seqlens() == np.arange(n + 1)).all()
    assert calls[0].vars["reach"] == (128 if n < 29 else 512)  # seq_lens up to 100 + n, to a power of two
    replay(calls, b, 64)


def test_a_decode_step_wider_than_every_program_is_cut(verified_1b):
    p = derive(verified_1b)
    qsl, b = fake_vllm_batch([50] * 600, [1] * 600)
    calls = plan(p, np.diff(qsl), 51)
    assert [(c.stepper.program, c.seqs) for c in calls] == [("decode_wide", (0, 256)), ("decode_wide", (256, 512)),
                                                             ("decode_wide", (512, 600))]
    _, logits_from = replay(calls, b, 64)
    assert sorted(logits_from) == list(range(600))


def test_vllms_padding_is_left_out(verified_1b):
    """A full graph's padded requests have no rows (query_start_loc repeats the last value)."""
    p = derive(verified_1b)
    qsl = np.array([0, 1, 2, 3, 3, 3, 3, 3, 3], np.int32)  # 3 live of 8 padded requests
    calls = plan(p, np.diff(qsl), MAX_MODEL_LEN)
    assert [c.seqs for c in calls] == [(0, 3)] and calls[0].vars["seqs"] == 3


def test_a_batch_past_the_ragged_programs_bounds_splits_sequences_in_order(small_limits):
    """4 sequences and 64 rows a call: a 150-row prefill spans three calls, its logits come from
    the call that holds its last row, and the rows keep their order and positions."""
    p = derive(small_limits)
    computed, scheduled = [0, 10, 20, 30, 40, 5], [150, 1, 1, 30, 1, 2]
    qsl, b = fake_vllm_batch(computed, scheduled)
    calls = plan(p, np.diff(qsl), int(b.seq_lens.max()))
    assert all(c.stepper.program == "prefill" for c in calls)
    assert [[(x.seq, x.rows, x.tail) for x in c.pieces] for c in calls] == [
        [(0, 64, 86)], [(0, 64, 22)], [(0, 22, 0), (1, 1, 0), (2, 1, 0), (3, 30, 0)], [(4, 1, 0), (5, 2, 0)]]
    m = {"mask_rows": 1}  # no row masked: the host samples
    assert [c.vars for c in calls] == [{"prefill_seqs": 1, "tokens": 64, **m}, {"prefill_seqs": 1, "tokens": 64, **m},
                                       {"prefill_seqs": 4, "tokens": 54, **m}, {"prefill_seqs": 2, "tokens": 3, **m}]
    rows, logits_from = replay(calls, b, 64)
    assert rows == [(s, x) for s, (c, q) in enumerate(zip(computed, scheduled)) for x in range(c, c + q)]
    last = {x.seq: i for i, c in enumerate(calls) for x in c.pieces if x.tail == 0}
    assert logits_from == last  # a split sequence's logits: the later call's, written last


def test_a_narrower_block_table_fills_the_first_columns(verified_1b):
    p = derive(verified_1b)
    qsl, b = fake_vllm_batch([0], [40])
    (call,) = plan(p, np.diff(qsl), 40)
    width = 4096 // 16  # the deployment's page table columns (context 4096)
    assert sources(call, b, width)["p_page_table"].shape == (1, 64)  # vLLM's: cdiv(1024, 16)


def test_what_a_host_cannot_serve_is_refused(verified_1b):
    p = derive(verified_1b)
    no_ragged = type(p)(tuple(s for s in p.steppers if not s.ragged), p.once, p.paged_states, p.max_positions)
    with pytest.raises(HostError, match="no ragged program"):
        check_protocol(no_ragged)
    with pytest.raises(HostError, match="outside the var bound"):
        plan(p, [1, 1], 10 ** 6)  # a reach past the deployment's context
