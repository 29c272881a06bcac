"""MLA's absorbed attention (kernels/cuda/mla_tc.cu) off the GPU: a float64 reference, a numpy
model of the kernel's order, and a paged latent cache of random rows, shared by the CPU test of
the model (test_mla_tc_model.py), the GPU tests (test_cuda_gpu_mla_tc.py) and the timing probe
(bench/probes/mla_tc.py).

The model follows mla_tc.cu step for step in f32: q rounded to bf16; a row's keys cut in chunks
of `chunk` keys from key 0 (CHUNK, the deployment's split: manifests/cuda.py MLA_CHUNK), a chunk
in tiles of BN from its first key; a tile's scores the sum of 4 runs of k16 steps (((run0 +
run1) + run2) + run3), the online softmax in log2 units (attention_tc.cuh's attn_softmax_pv), P
rounded to bf16 times the latents; a chunk's l its quad's 4 column parts added in xor order; the
chunks' (m, l, acc) folded in order 0, 1, ... from (-inf, 0, 0) (attention_tc.cuh's attn_fold),
o = A / L. A chunk's (m, l, acc) depends on its keys alone, so decode (a block a chunk, its
partial stored, the last block folding them) and prefill (a block walking the chunks, folding
as it goes) give a row the same bits: model_partial and model_fold are those two halves. What it cannot model is
the mma's own sum of a k16 step's 16 products (the hardware's, undocumented): it takes them in
float64 rounded once to f32 (a k16 step) -- so it predicts the kernel within rounding, not to
the bit. It runs any rows packed 16 to an mma tile in any order, as the kernel's groups do."""

from __future__ import annotations

import numpy as np

BN, RUNS, K16 = 32, 4, 16  # mla_tc.cu MLA_BN, the 4 warps' runs of the scores, the mma's k
CHUNK = 2048  # manifests/cuda.py MLA_CHUNK: keys a chunk (a multiple of BN)
LOG2E = np.float32(1.4426950408889634)
BF16 = np.uint16


def bf16_round(x: np.ndarray) -> np.ndarray:
    """f32 -> bf16 -> f32, round to nearest even (the kernels' __float2bfloat16_rn)."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return r.astype(np.uint32).view(np.float32)


def bf16_bits(x: np.ndarray) -> np.ndarray:
    return (bf16_round(x).view(np.uint32) >> 16).astype(BF16)


def from_bits(b: np.ndarray) -> np.ndarray:
    return (b.astype(np.uint32) << 16).view(np.float32)


def scale_log2(nope: int, rope: int) -> np.float32:
    """The kernel's scale: (1 / sqrt(nope + rope)) * log2(e), each step rounded to f32."""
    return np.float32(np.float32(1.0) / np.sqrt(np.float32(nope + rope))) * LOG2E


def reference(q_abs: np.ndarray, keys: np.ndarray, kv_lora: int, nope: int, rope: int) -> np.ndarray:
    """float64 absorbed attention of one query row of one head over its keys: q_abs [width]
    (q_lat | q_rope), keys [ctx, width] (latent | key part); softmax(q . k / sqrt(nope + rope))
    . latents, [kv_lora]."""
    s = keys.astype(np.float64) @ q_abs.astype(np.float64) / np.sqrt(nope + rope)
    p = np.exp(s - s.max())
    return (p @ keys[:, :kv_lora].astype(np.float64)) / p.sum()


def model_partial(q_abs: np.ndarray, keys: np.ndarray, ctx: int, kv_lora: int, nope: int, rope: int, k0: int,
                  k1: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One chunk, keys k0 .. k1 - 1 (k0 a multiple of BN, k1 <= ctx), for one mma tile of 16 rows
    (heads) sharing one context: q_abs [16, width] f32 (rounded to bf16 here, as the kernel loads
    it), keys [>= ctx, width] bf16 values in f32. Returns the chunk's (m [16], l [16], acc [16,
    kv_lora]) f32: what a decode block stores as its partial."""
    f32 = np.float32
    width = keys.shape[1]
    nk = width // K16
    kw = (nk + RUNS - 1) // RUNS
    q = bf16_round(q_abs).astype(np.float64)
    sl2 = scale_log2(nope, rope)
    m = np.full(16, -np.inf, f32)
    lpart = np.zeros((16, 4), f32)  # a row's l: the 4 threads of its quad, 2 columns of each 8
    acc = np.zeros((16, kv_lora), f32)
    for kb in range(k0, k1, BN):
        tile = np.zeros((BN, width), np.float64)
        n = min(BN, k1 - kb)
        tile[:n] = keys[kb:kb + n]
        s = np.zeros((16, BN), f32)
        for w in range(RUNS):  # a warp's run: its k16 steps in order, the mma's f32 accumulator
            run = np.zeros((16, BN), f32)
            for kc in range(w * kw, min((w + 1) * kw, nk)):
                c = slice(kc * K16, (kc + 1) * K16)
                run = (run + (q[:, c] @ tile[:, c].T).astype(f32)).astype(f32)
            s = run if w == 0 else (s + run).astype(f32)
        s = (s * sl2).astype(f32)
        s[:, np.arange(BN) + kb >= ctx] = -np.inf
        mn = np.maximum(m, s.max(axis=1))
        mu = np.where(mn == -np.inf, f32(0), mn).astype(f32)
        corr = np.exp2((m - mu).astype(f32)).astype(f32)
        m = mn
        lpart = (lpart * corr[:, None]).astype(f32)
        acc = (acc * corr[:, None]).astype(f32)
        p = np.exp2((s - mu[:, None]).astype(f32)).astype(f32)
        # a thread's columns: 8 j + 2 t4 + {0, 1} for j = 0 .. BN / 8 - 1, added j by j, e by e
        for j in range(BN // 8):
            for e in range(2):
                lpart = (lpart + p[:, 8 * j + 2 * np.arange(4) + e]).astype(f32)
        pb = bf16_round(p).astype(np.float64)
        for kk in range(BN // 16):  # P V in k16 steps of 16 keys
            c = slice(16 * kk, 16 * kk + 16)
            acc = (acc + (pb[:, c] @ tile[c, :kv_lora]).astype(f32)).astype(f32)
    l = (lpart[:, 0] + lpart[:, 1]).astype(f32)
    l2 = (lpart[:, 2] + lpart[:, 3]).astype(f32)
    l = (l + l2).astype(f32)  # the xor order: (t0 + t1) + (t2 + t3)
    return m, l, acc


def model_fold(parts) -> np.ndarray:
    """The chunks' partials (m, l, acc) folded in order from (-inf, 0, 0), as attn_fold: M' =
    max(M, m), co = exp2(M - M'), cz = exp2(m - M'), L = L co + l cz, A = A co + acc cz (each
    product and sum rounded to f32); o = A / L."""
    f32 = np.float32
    M = L = A = None
    for m, l, acc in parts:
        if M is None:
            M, L, A = np.full_like(m, -np.inf), np.zeros_like(l), np.zeros_like(acc)
        Mn = np.maximum(M, m)
        with np.errstate(invalid="ignore"):
            co = np.exp2((M - Mn).astype(f32)).astype(f32)
        cz = np.exp2((m - Mn).astype(f32)).astype(f32)
        L = ((L * co).astype(f32) + (l * cz).astype(f32)).astype(f32)
        A = ((A * co[:, None]).astype(f32) + (acc * cz[:, None]).astype(f32)).astype(f32)
        M = Mn
    return (A / L[:, None]).astype(f32)


def chunks(ctx: int, chunk: int = CHUNK) -> list[tuple[int, int]]:
    """A row's chunks: keys [z chunk, min(ctx, (z + 1) chunk)) for z = 0 .. ceil(ctx / chunk) - 1."""
    assert chunk % BN == 0
    return [(k0, min(ctx, k0 + chunk)) for k0 in range(0, ctx, chunk)]


def model_group(q_abs: np.ndarray, keys: np.ndarray, ctx: int, kv_lora: int, nope: int, rope: int,
                chunk: int = CHUNK) -> np.ndarray:
    """The kernel's order for one mma tile of 16 rows (heads) sharing one context (model_partial's
    q_abs and keys): every chunk's partial, folded in order. Returns o [16, kv_lora] f32."""
    return model_fold(model_partial(q_abs, keys, ctx, kv_lora, nope, rope, k0, k1) for k0, k1 in chunks(ctx, chunk))


def model_rows(q_abs: np.ndarray, keys_of, ctxs: np.ndarray, kv_lora: int, nope: int, rope: int,
               order: np.ndarray | None = None, chunk: int = CHUNK) -> np.ndarray:
    """Rows of (position, head) pairs, q_abs [n, width], packed 16 to a tile in `order` (a
    permutation of the rows; rows of one tile must share a context: the kernel packs heads of one
    position), the last tile padded by repeating its last row. keys_of(i): row i's keys."""
    n = len(q_abs)
    order = np.arange(n) if order is None else order
    out = np.empty((n, kv_lora), np.float32)
    for t0 in range(0, n, 16):
        idx = order[t0:t0 + 16]
        pad = np.concatenate([idx, np.repeat(idx[-1:], 16 - len(idx))])
        assert len(set(ctxs[pad])) == 1, "a tile's rows share one context"
        o = model_group(q_abs[pad], keys_of(idx[0]), int(ctxs[idx[0]]), kv_lora, nope, rope, chunk)
        out[idx] = o[:len(idx)]
    return out


class Cache:
    """A paged MLA cache of random bf16 rows: n_pages pages of page_tokens tokens, LAYERS layers,
    [layer][token][latent | key part] a page (mla.cu's mla_row); sequence s's pages table[s]
    (shuffled). tokens(s, layer, n): its first n cached rows as f32."""

    def __init__(self, rng, lengths, kv_lora: int, rope: int, page_tokens: int = 16, layers: int = 2):
        self.kv_lora, self.rope, self.width = kv_lora, rope, kv_lora + rope
        self.page_tokens, self.layers = page_tokens, layers
        self.token_bytes = 1 << (layers * self.width * 2 - 1).bit_length()
        self.pages_per_seq = max(-(-n // page_tokens) for n in lengths)
        n_pages = len(lengths) * self.pages_per_seq
        self.bits = bf16_bits(rng.standard_normal(n_pages * page_tokens * self.token_bytes // 2).astype(np.float32))
        self.table = rng.permutation(n_pages).astype(np.int32).reshape(len(lengths), self.pages_per_seq)

    def tokens(self, s: int, layer: int, n: int) -> np.ndarray:
        out = np.empty((n, self.width), np.float32)
        per_page = self.page_tokens * self.token_bytes // 2
        for t in range(n):
            base = int(self.table[s, t // self.page_tokens]) * per_page
            row = base + (layer * self.page_tokens + t % self.page_tokens) * self.width
            out[t] = from_bits(self.bits[row:row + self.width])
        return out


# ---- the up-projections (mla_tc.cu's mla_absorb_tc, mla_expand_tc) -------------------------
# A row's outputs summed over k16 steps in order from 0 into one f32 accumulator, each step's
# 16 products taken as the emulator's mma takes them (float64, rounded once to f32): the
# emulated kernels agree to the bit, the hardware within an mma's rounding.

def _k16_steps(acc: np.ndarray, a: np.ndarray, w: np.ndarray) -> np.ndarray:
    """acc [rows, n] f32 += a [rows, k] @ w [k, n], a k16 step at a time, each step rounded once."""
    for k0 in range(0, a.shape[1], K16):
        step = a[:, k0:k0 + K16].astype(np.float64) @ w[k0:k0 + K16].astype(np.float64)
        acc = (acc.astype(np.float64) + step).astype(np.float32)
    return acc


def model_absorb(q: np.ndarray, kv_b: np.ndarray, heads: int, nope: int, rope: int, v_dim: int,
                 kv_lora: int) -> np.ndarray:
    """q_lat [rows, heads, kv_lora] f32 from q [rows, heads * (nope + rope)] (bf16 values as f32)
    and kv_b [heads * (nope + v_dim), kv_lora] (bf16 values as f32)."""
    rows = q.shape[0]
    qh = q.reshape(rows, heads, nope + rope)
    wk = kv_b.reshape(heads, nope + v_dim, kv_lora)
    return np.stack([_k16_steps(np.zeros((rows, kv_lora), np.float32), qh[:, h, :nope], wk[h, :nope])
                     for h in range(heads)], axis=1)


def model_expand(o_lat: np.ndarray, kv_b: np.ndarray, heads: int, nope: int, v_dim: int, kv_lora: int) -> np.ndarray:
    """o [rows, heads * v_dim] as bf16 bits from o_lat [rows, heads, kv_lora] f32: o_lat split
    hi = bf16(x), lo = bf16(x - hi); each k16 step adds hi W then lo W."""
    rows = o_lat.shape[0]
    hi = bf16_round(o_lat)
    lo = bf16_round((o_lat - hi).astype(np.float32))
    wv = kv_b.reshape(heads, nope + v_dim, kv_lora)[:, nope:]  # [heads, v_dim, kv_lora]
    out = np.empty((rows, heads, v_dim), np.float32)
    for h in range(heads):
        acc = np.zeros((rows, v_dim), np.float32)
        w = wv[h].T  # [kv_lora, v_dim]
        for k0 in range(0, kv_lora, K16):
            for part in (hi, lo):
                step = part[:, h, k0:k0 + K16].astype(np.float64) @ w[k0:k0 + K16].astype(np.float64)
                acc = (acc.astype(np.float64) + step).astype(np.float32)
        out[:, h] = acc
    return bf16_bits(out.reshape(rows, heads * v_dim))
