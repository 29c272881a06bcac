"""The Kimi-Linear kernels behind a request's bytes not depending on its batch or on where its
prompt was cut, on the GPU, bit for bit (docs/determinism.md):

- the prompt's recurrence in the invariant forms (kda_tc and kda_tc_decode, the default build's
  ops kda_chunked and kda_step; kda_tokens and kda_step, a kda_form="tokens" build's): a prompt
  fed whole, or cut anywhere into prefill steps each beside other sequences, or its last rows
  decoded at any row of a batch, gives every token's output and the state after it the same
  bytes (kda_tc's: the state at the chunk's start and the chunk's rows kept);
- MLA: a prompt row through prefill's attention (absorb, attend, expand over ragged rows) gives
  the bytes the same token gets decoded, whatever rows share either step;
- the default build's plain projections: linear_gemm (prefill's and the wide decode's rows)
  gives every row the bytes linear_gemv (decode's) gives it, at any number of rows.

    python -m pytest -q tests/kimi_linear/test_cuda_gpu_invariant.py   (on the H200; seconds)"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

BF16 = np.uint16
LAYERS, LAYER, CONV, SLOTS = 2, 1, 4, 8
SPLIT = 32  # mla_tc's chunk of keys here (the deployment's: 2,048), so the 40-token sequence spans two


@pytest.fixture(scope="module", params=["tc", "tokens"])
def ops(request):
    from kern_models.kimi_linear.kernels.cuda import table

    return table.ops(request.param)


def _kept_rows(ops: dict) -> int:
    """The rows of dim f32 a head keeps in the slot after every layer's part: kda_tc's k, gc and
    v' of its chunk (3 x 16), the other forms none."""
    from kern_models.kimi_linear.kernels.cuda import table

    tc = any(la["entry"] == "kda_tc" for la in ops["kda_chunked"]["impl"]["launches"])
    return table.KDA_TC_ROWS * table.KDA_TC_C if tc else 0


def _bf16(rng, shape, scale=1.0) -> np.ndarray:
    f = (rng.standard_normal(shape) * scale).astype(np.float32)
    return (f.view(np.uint32) + 0x7FFF + ((f.view(np.uint32) >> 16) & 1) >> 16).astype(BF16)


def _run(gpu, spec: dict, named: dict) -> None:
    from tests.cuda.cuda_gpu import op_launches
    from kern.runtime.devices.cuda.launch import launch

    for la in op_launches(gpu, spec, dict(named)):
        launch(la, gpu.stream)
    gpu.stream.synchronize()


# ---- the KDA recurrence ------------------------------------------------------------------

class Kda:
    """Token inputs of several sequences (after the convolution and the gate: mix rows [q|k|v],
    g <= 0, b) and one state buffer of SLOTS slots, poisoned (a sequence at position 0 must not
    read its slot)."""

    def __init__(self, gpu, ops, heads: int, dim: int, lengths: list[int], seed: int, extra: dict | None = None):
        rng = np.random.default_rng(seed)
        self.gpu, self.ops, self.heads, self.dim, self.extra = gpu, ops, heads, dim, extra or {}
        self.W = heads * dim
        self.seqs = [dict(mix=_bf16(rng, (n, 3 * self.W)),
                          g=-rng.uniform(0.001, 0.6, (n, self.W)).astype(np.float32),
                          b=rng.standard_normal((n, heads)).astype(np.float32)) for n in lengths]
        per = heads * dim * dim + (CONV - 1) * 3 * self.W
        self.kept = _kept_rows(ops)
        self.slot_bytes = LAYERS * (per + self.kept * self.W) * 4
        self.state = gpu.empty(SLOTS * self.slot_bytes)
        self.geo = dict(layer=LAYER, layers=LAYERS, heads=heads, dim=dim, conv=CONV, slot_bytes=self.slot_bytes)

    def fresh(self) -> None:
        from kern.runtime.devices.cuda import memory

        memory.memset(self.state.ptr, 0xFF, self.state.nbytes)

    def _rows(self, parts):
        """parts: (sequence, first row, rows); the inputs laid end to end, their positions."""
        cat = lambda k: np.concatenate([self.seqs[s][k][r0:r0 + n] for s, r0, n in parts])
        pos = np.concatenate([np.arange(r0, r0 + n) for _, r0, n in parts]).astype(np.int32)
        return cat("mix"), cat("g"), cat("b"), pos

    def prefill(self, parts) -> list[np.ndarray]:
        """One launch of the op kda_chunked (kda_tokens, kda_tc) over these (sequence, first row,
        rows) parts, sequence s on slot s; each part's outputs."""
        mix, g, b, pos = self._rows(parts)
        rows = len(pos)
        o = self.gpu.empty(rows * self.W * 2)
        cu = np.cumsum([0] + [n for _, _, n in parts]).astype(np.int32)
        _run(self.gpu, self.ops["kda_chunked"], dict(
            mix=self.gpu.put(mix), g=self.gpu.put(g), b=self.gpu.put(b), state=self.state,
            slot=self.gpu.put(np.array([s for s, _, _ in parts], np.int32)), cu_seqlens=self.gpu.put(cu),
            pos=self.gpu.put(pos), o=o, n_seqs=len(parts), rows=rows, pre=self.gpu.empty(rows * self.W * 4 * 2 + rows * self.heads * 4 * 32),
            **self.geo, **self.extra))  # pre: kda_tc_prep's [rows, heads, 2 x 16 + 2 dim] f32 (the other forms ignore it)
        out = self.gpu.get(o, BF16, (rows, self.W))
        assert not (out == 0xFFFF).any(), "the prefill recurrence left an output unwritten"
        return [out[cu[i]:cu[i + 1]] for i in range(len(parts))]

    def decode(self, rows) -> list[np.ndarray]:
        """One launch of the op kda_step (kda_step, kda_tc_decode) over these (sequence, row)
        one-token rows; each row's output."""
        parts = [(s, r, 1) for s, r in rows]
        mix, g, b, pos = self._rows(parts)
        o = self.gpu.empty(len(rows) * self.W * 2)
        _run(self.gpu, self.ops["kda_step"], dict(
            mix=self.gpu.put(mix), g=self.gpu.put(g), b=self.gpu.put(b), state=self.state,
            slot=self.gpu.put(np.array([s for s, _ in rows], np.int32)), pos=self.gpu.put(pos), o=o,
            rows=len(rows), **self.geo))
        out = self.gpu.get(o, BF16, (len(rows), self.W))
        assert not (out == 0xFFFF).any(), "the decode recurrence left an output unwritten"
        return list(out)

    def layer_state(self, s: int, n: int | None = None) -> np.ndarray:
        """Sequence s's recurrent state in the tested layer (its slot's part) after its first n
        rows (all of them by default), as raw bits; kda_tc's: the state at the chunk's start,
        then the rows the chunk keeps (k, gc and v' of rows 0 .. n % 16 - 1 of each head)."""
        from kern_models.kimi_linear.kernels.cuda import table

        per = self.heads * self.dim * self.dim + (CONV - 1) * 3 * self.W
        slot = self.gpu.get(self.state, np.uint32, (SLOTS, self.slot_bytes // 4))[s]
        bits = slot[LAYER * per:LAYER * per + self.heads * self.dim * self.dim].copy()
        assert not (bits == 0xFFFFFFFF).any(), f"sequence {s}'s state left unwritten"
        if self.kept:
            C = table.KDA_TC_C
            t = (len(self.seqs[s]["mix"]) if n is None else n) % C
            kept = slot[LAYERS * per:].reshape(LAYERS, self.heads, table.KDA_TC_ROWS, C, self.dim)[LAYER, :, :, :t]
            assert not (kept == 0xFFFFFFFF).any(), f"sequence {s}'s kept rows left unwritten"
            bits = np.concatenate([bits, kept.reshape(-1)])
        return bits


SHAPES = [(4, 128), (3, 64), (2, 16)]  # (heads, dim): the real head, a half one, the tiny model's


def _whole(kda: Kda, s: int) -> tuple[np.ndarray, np.ndarray]:
    kda.fresh()
    out, = kda.prefill([(s, 0, len(kda.seqs[s]["mix"]))])
    return out, kda.layer_state(s)


def _cut_anywhere(kda: Kda) -> list[str]:
    """Four sequences, each cut at random places into prefill steps that run beside the others'
    pieces (shuffled in each launch): every sequence whose outputs or state differ from its
    whole prompt's, named."""
    ref = {s: _whole(kda, s) for s in range(4)}
    rng = np.random.default_rng(1)
    bad = []
    for trial in range(4):
        kda.fresh()
        cuts = {s: sorted(set(rng.integers(1, len(kda.seqs[s]["mix"]), rng.integers(0, 4)).tolist()))
                for s in range(4)}
        pieces = {s: list(zip([0] + cuts[s], cuts[s] + [len(kda.seqs[s]["mix"])])) for s in range(4)}
        got = {s: [] for s in range(4)}
        while any(pieces.values()):  # each launch: the next piece of every sequence with one left, shuffled
            parts = [(s, *pieces[s].pop(0)) for s in rng.permutation(4) if pieces[s]]
            for (s, lo, hi), out in zip(parts, kda.prefill([(s, lo, hi - lo) for s, lo, hi in parts])):
                got[s].append(out)
        for s in range(4):
            if not np.array_equal(np.concatenate(got[s]), ref[s][0]):
                bad.append(f"trial {trial}: sequence {s} cut at {cuts[s]}: outputs")
            if not np.array_equal(kda.layer_state(s), ref[s][1]):
                bad.append(f"trial {trial}: sequence {s} cut at {cuts[s]}: state")
    return bad


@pytest.mark.parametrize("heads,dim", SHAPES)
def test_a_prompt_cut_anywhere_beside_other_sequences_gets_the_bytes_it_gets_whole(gpu, ops, heads, dim):
    assert _cut_anywhere(Kda(gpu, ops, heads, dim, [45, 30, 19, 52], seed=dim)) == []


def test_the_chunked_form_s_bits_do_depend_on_the_cut(gpu):
    """What the invariant forms are for: the same cuts through kda_chunked's 16-row chunks from
    each call's first row (the faster build's prefill) move some sequence's bytes (the test
    above has teeth)."""
    from kern_models.kimi_linear.kernels.cuda import table

    assert _cut_anywhere(Kda(gpu, table.ops("chunked"), 4, 128, [45, 30, 19, 52], seed=128, extra={"chunk": 16}))


@pytest.mark.parametrize("heads,dim", SHAPES)
@pytest.mark.parametrize("decoded", [1, 3, 45])  # 45: every token through decode, from position 0
def test_a_prompt_s_last_rows_decoded_among_others_get_the_bytes_they_get_in_prefill(gpu, ops, heads, dim, decoded):
    kda = Kda(gpu, ops, heads, dim, [45] + [60] * 6, seed=dim + 7)
    want, state = _whole(kda, 0)
    kda.fresh()
    n = len(kda.seqs[0]["mix"])
    others = [kda.prefill([(s, 0, 5)]) for s in range(1, 7)]  # the others' slots hold a state
    assert others
    got = [] if decoded == n else kda.prefill([(0, 0, n - decoded)])
    rng = np.random.default_rng(decoded)
    for i, r in enumerate(range(n - decoded, n)):
        batch = [(s, 5 + i) for s in rng.permutation(range(1, 7))[:rng.integers(0, 6)]]
        at = int(rng.integers(0, len(batch) + 1))
        batch.insert(at, (0, r))
        got.append(kda.decode(batch)[at][None])
    assert np.array_equal(np.concatenate(got), want)
    assert np.array_equal(kda.layer_state(0), state)


# ---- MLA ----------------------------------------------------------------------------------

@pytest.mark.parametrize("mla_form", ["tensor", "cores"])
@pytest.mark.parametrize("heads,nope,rope,v_dim,kv_lora", [(4, 128, 64, 128, 512), (9, 16, 16, 16, 32)])
def test_an_mla_prompt_row_gets_the_bytes_it_gets_decoded(gpu, mla_form, heads, nope, rope, v_dim, kv_lora):
    """Cached latents of three sequences (random, in shuffled pages); prefill's attention over a
    ragged batch of their rows, then each row again through decode's, alone and beside others;
    the attention on tensor cores (the default build's) and on CUDA cores (the faster build's).
    The default build's prefill gives a generated row (a preempted request's, recomputed) decode's
    absorbed form, so every row here is a generated one (prompt_len 0); a prompt row's expanded
    form is test_cuda_gpu_mla_x.py's."""
    from kern_models.kimi_linear.kernels.cuda import table

    ops = table.ops("tokens", mla_form)
    rng = np.random.default_rng(heads)
    page_tokens, lengths, pages_per_seq = 16, [40, 17, 33], 3
    width = kv_lora + rope
    token_bytes = 1 << (LAYERS * width * 2 - 1).bit_length()
    n_pages = len(lengths) * pages_per_seq
    kv = gpu.put(_bf16(rng, (n_pages * page_tokens * token_bytes // 2,), 1.0))
    table = rng.permutation(n_pages).astype(np.int32).reshape(len(lengths), pages_per_seq)
    kv_b = gpu.put(_bf16(rng, (heads * (nope + v_dim), kv_lora), 0.05))
    qd = nope + rope
    qs = [_bf16(rng, (n, heads * qd)) for n in lengths]
    geo = dict(pages_per_seq=pages_per_seq, layer=LAYER, layers=LAYERS, heads=heads, nope=nope, rope=rope,
               kv_lora=kv_lora, page_tokens=page_tokens, token_bytes=token_bytes, v_dim=v_dim)

    def attend(spec, q, pos, tables, cu=None):
        rows = len(pos)
        o = gpu.empty(rows * heads * v_dim * 2)
        named = dict(q=gpu.put(q), kv=kv, page_table=gpu.put(tables), pos=gpu.put(np.asarray(pos, np.int32)),
                     kv_b=kv_b, o=o, q_lat=gpu.empty(rows * heads * kv_lora * 4),
                     o_lat=gpu.empty(rows * heads * kv_lora * 4), rows=rows, **geo)
        if cu is not None:
            named |= dict(cu_seqlens=gpu.put(np.asarray(cu, np.int32)), n_seqs=len(cu) - 1)
            if mla_form == "tensor":  # no prompt row: no keys to expand, mla_attend_x's blocks all leave
                named |= dict(prompt_len=gpu.put(np.zeros(len(cu) - 1, np.int32)), keys=1,
                              koff=gpu.put(np.zeros(len(cu), np.int32)), kx=gpu.empty(heads * (nope + v_dim) * 2))
        if mla_form == "tensor":  # mla_tc's split; decode: a block a (row, head group, chunk), the last folds
            named["chunk"] = SPLIT
            if cu is None:
                splits = -(-(max(pos) + 1) // SPLIT) + 1
                named |= dict(splits=splits, part_o=gpu.empty(rows * heads * splits * kv_lora * 4),
                              part_ml=gpu.empty(rows * heads * splits * 2 * 4),
                              sem=gpu.put(np.zeros(rows * heads, np.int32)))
        _run(gpu, ops[spec], named)
        out = gpu.get(o, BF16, (rows, heads * v_dim))
        assert not (out == 0xFFFF).any(), f"{spec} left an output unwritten"
        return out

    # prefill: the last rows of each sequence (its earlier tokens cached), one ragged step
    tail = [(0, 23, 17), (1, 0, 17), (2, 20, 13)]
    q = np.concatenate([qs[s][lo:lo + n] for s, lo, n in tail])
    pos = np.concatenate([np.arange(lo, lo + n) for _, lo, n in tail])
    cu = np.cumsum([0] + [n for _, _, n in tail])
    pre = attend("mla_attention", q, pos, table[[s for s, _, _ in tail]], cu)
    rows = [(s, p) for s, lo, n in tail for p in range(lo, lo + n)]
    for i, (s, p) in enumerate(rows):
        alone = attend("mla_attention_decode", qs[s][p][None], [p], table[[s]])
        assert np.array_equal(alone[0], pre[i]), f"sequence {s} position {p}: decoded alone != prefill"
    picks = rng.permutation(len(rows))[:20]  # 20 rows decoded as one batch, in shuffled order
    batch = attend("mla_attention_decode", np.stack([qs[rows[i][0]][rows[i][1]] for i in picks]),
                   [rows[i][1] for i in picks], table[[rows[i][0] for i in picks]])
    for j, i in enumerate(picks):
        assert np.array_equal(batch[j], pre[i]), f"row {rows[i]} decoded beside 19 others != prefill"


# ---- the plain projections ----------------------------------------------------------------

# (rows, N, K): the tiny model's narrowest K (16: less than a tensor map's box), a partial last
# unit (576), all 8 partials (2048); rows past one 128-row block of linear_gemm, N past one tile
@pytest.mark.parametrize("rows,N,K", [(3, 64, 16), (130, 200, 576), (259, 128, 2048)])
def test_the_plain_projection_gives_each_row_the_gemv_bytes_at_any_rows(gpu, ops, rows, N, K):
    rng = np.random.default_rng(rows + N + K)
    x, W = _bf16(rng, (rows, K), 2.0), gpu.put(_bf16(rng, (N, K), 0.05))

    def out_of(spec, r0, n):
        y = gpu.empty(n * N * 2)
        _run(gpu, ops[spec], dict(x=gpu.put(x[r0:r0 + n]), W=W, y=y, rows=n, N=N, K=K))
        return gpu.get(y, BF16, (n, N))

    want = out_of("linear", 0, rows)
    assert not (want == 0xFFFF).any() and np.array_equal(out_of("linear_rows", 0, rows), want)
    for r in sorted({0, rows // 2, rows - 1}):
        assert np.array_equal(out_of("linear_rows", r, 1)[0], want[r]), f"row {r} alone != row {r} of {rows}"
    # the wide decode's split (K over 8 blocks a column tile, the partials added in order)
    tiles = -(-N // 128) * -(-rows // 64)
    y = gpu.empty(rows * N * 2)
    _run(gpu, ops["linear_rows_split"], dict(x=gpu.put(x), W=W, y=y, part=gpu.empty(tiles * 8 * 8192 * 4),
                                             sem=gpu.put(np.zeros(tiles, np.int32)), rows=rows, N=N, K=K))
    assert np.array_equal(gpu.get(y, BF16, (rows, N)), want), "linear_rows_split != the gemv"
