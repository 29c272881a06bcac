"""CPU kernels for the llama family: numpy, fp32 storage and accumulation.

This file is a kern module: a deployment pins it by sha256 like a cubin, and the CPU device
calls its functions with numpy views of the manifest's buffers (shaped for the current step)
and plain Python scalars. A paged state arrives as a flat uint8 array of pages; within a
page the layout is [layer][k=0|v=1][kv_head][token_in_page][head_dim] in f32.

Batch invariance: a row's bits depend on that row (its token, position and its sequence's
cached k/v) and never on the other rows of the step, their number or its place among them.
BLAS picks its kernel and blocking by shape (a gemm of 8 rows and a gemv of one round
differently), so every reduction here runs in a call whose shape is fixed by the weights and
the row's own context alone: linear is a gemv a row over fixed panels of the weight, attention
runs each query row over exactly its own positions, norms reduce each row alone. Prefill and
decode rows go through the same functions, so a token's state and logits are the same in a
prompt chunk of any size, a decode batch of any size, or recomputed after a cache hit.
"""

import numpy as np


def embed(ids, table, x):
    np.take(table, ids, axis=0, out=x)


def _norm(x, w, eps, out):
    var = np.add.reduce(x * x, axis=-1) / x.shape[-1]  # each row's own pairwise sum
    np.multiply(x, (1.0 / np.sqrt(var + eps))[:, None].astype(np.float32), out=out)
    out *= w


def rms_norm(x, w, y, eps):
    _norm(x, w, eps, y)


def add_rms_norm(res, x, w, y, eps):
    res += x
    _norm(res, w, eps, y)


def head_rms_norm(qkv, qw, kw, heads, kv_heads, head_dim, eps):
    """Qwen3's per-head RMSNorm of q and k, in place inside the fused qkv rows."""
    t = qkv.shape[0]
    for lo, n, w in ((0, heads, qw), (heads * head_dim, kv_heads, kw)):
        part = qkv[:, lo:lo + n * head_dim].reshape(t * n, head_dim)
        out = np.empty_like(part)
        _norm(part, w, eps, out)
        qkv[:, lo:lo + n * head_dim] = out.reshape(t, n * head_dim)


# A weight panel a row's gemv reads while it stays in cache for the next row (bytes).
PANEL_BYTES = 1 << 19


def linear(x, w, y):
    """y = x @ w.T a row at a time: one gemv per row and fixed panel of w's rows, so each
    output's dot product is the same call whatever the number of rows (one gemm over the rows
    is faster on a prompt chunk, docs/perf.md, and its bits change with them)."""
    n, k = w.shape
    step = max(1, PANEL_BYTES // (4 * k))
    for lo in range(0, n, step):
        panel, out = w[lo:lo + step], y[:, lo:lo + step]
        for r in range(x.shape[0]):
            np.matmul(panel, x[r], out=out[r])


def rope_table(table, theta, factor, low_freq_factor, high_freq_factor, original_max_pos):
    """cos in [:, :d/2], sin in [:, d/2:], for every position; llama3 scaling when factor > 0."""
    n, d = table.shape
    inv = (1.0 / (np.float32(theta) ** (np.arange(0, d, 2, dtype=np.int64).astype(np.float32) / d))).astype(np.float32)
    if factor > 0:
        low_wavelen = original_max_pos / low_freq_factor
        high_wavelen = original_max_pos / high_freq_factor
        wavelen = 2 * np.pi / inv
        scaled = np.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (original_max_pos / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        inv = np.where(medium, smoothed, scaled).astype(np.float32)
    freqs = np.outer(np.arange(n, dtype=np.float32), inv).astype(np.float32)
    table[:, : d // 2] = np.cos(freqs)
    table[:, d // 2:] = np.sin(freqs)


def rope(qkv, pos, table, heads, kv_heads, head_dim):
    """Rotate-half rope of the q and k heads of the fused qkv rows, in place."""
    t, half = qkv.shape[0], head_dim // 2
    cos = table[pos, :half][:, None, :]
    sin = table[pos, half:][:, None, :]
    n = heads + kv_heads
    qk = qkv[:, : n * head_dim].reshape(t, n, head_dim)
    a = qk[:, :, :half].copy()
    b = qk[:, :, half:].copy()
    qk[:, :, :half] = a * cos - b * sin
    qk[:, :, half:] = b * cos + a * sin


def _pages(kv, layers, kv_heads, page_tokens, head_dim):
    return kv.view(np.float32).reshape(-1, layers, 2, kv_heads, page_tokens, head_dim)


def kv_append(qkv, kv, page_table, cu_seqlens, pos, layer, layers, heads, kv_heads, head_dim, page_tokens):
    """Write each row's k and v at its position in its sequence's pages."""
    pages = _pages(kv, layers, kv_heads, page_tokens, head_dim)
    lo = heads * head_dim
    width = kv_heads * head_dim
    for s in range(len(cu_seqlens) - 1):
        r0, r1 = int(cu_seqlens[s]), int(cu_seqlens[s + 1])
        p = pos[r0:r1]
        phys = page_table[s][p // page_tokens]
        off = p % page_tokens
        k = qkv[r0:r1, lo:lo + width].reshape(-1, kv_heads, head_dim)
        v = qkv[r0:r1, lo + width:lo + 2 * width].reshape(-1, kv_heads, head_dim)
        pages[phys, layer, 0, :, off, :] = k
        pages[phys, layer, 1, :, off, :] = v


def kv_append_decode(qkv, kv, page_table, pos, layer, layers, heads, kv_heads, head_dim, page_tokens):
    """kv_append for one row per sequence (row r belongs to sequence r)."""
    pages = _pages(kv, layers, kv_heads, page_tokens, head_dim)
    lo = heads * head_dim
    width = kv_heads * head_dim
    rows = np.arange(len(pos))
    phys = page_table[rows, pos // page_tokens]
    off = pos % page_tokens
    pages[phys, layer, 0, :, off, :] = qkv[:, lo:lo + width].reshape(-1, kv_heads, head_dim)
    pages[phys, layer, 1, :, off, :] = qkv[:, lo + width:lo + 2 * width].reshape(-1, kv_heads, head_dim)


def _attend(q, pos_rows, pages, phys, layer, heads, kv_heads, head_dim, page_tokens, out):
    """q [n, heads, d] at positions pos_rows, each row over exactly its own positions of its
    sequence's cached k/v (no mask: a masked tail would change the softmax's summation tree).
    Each row's calls have shapes set by its position alone, in prefill and decode alike."""
    ctx = int(pos_rows.max()) + 1
    npg = -(-ctx // page_tokens)
    kv = pages[phys[:npg], layer]  # [npg, 2, kvh, P, d]
    k = kv[:, 0].transpose(1, 0, 2, 3).reshape(kv_heads, npg * page_tokens, head_dim)
    v = kv[:, 1].transpose(1, 0, 2, 3).reshape(kv_heads, npg * page_tokens, head_dim)
    scale = np.float32(1.0 / np.sqrt(head_dim))
    for r, p in enumerate(pos_rows):
        n = int(p) + 1
        qg = q[r].reshape(kv_heads, heads // kv_heads, head_dim)
        s = np.matmul(qg, k[:, :n].transpose(0, 2, 1))  # [kvh, g, n]
        s *= scale
        s -= s.max(axis=-1, keepdims=True)
        np.exp(s, out=s)
        s /= s.sum(axis=-1, keepdims=True)
        out[r] = np.matmul(s, v[:, :n]).reshape(heads * head_dim)


def attention(qkv, kv, page_table, cu_seqlens, pos, o, layer, layers, heads, kv_heads, head_dim, page_tokens):
    """Causal attention of each sequence's rows over its paged k/v (chunked prefill)."""
    pages = _pages(kv, layers, kv_heads, page_tokens, head_dim)
    for s in range(len(cu_seqlens) - 1):
        r0, r1 = int(cu_seqlens[s]), int(cu_seqlens[s + 1])
        q = qkv[r0:r1, : heads * head_dim].reshape(r1 - r0, heads, head_dim)
        _attend(q, pos[r0:r1], pages, page_table[s], layer, heads, kv_heads, head_dim, page_tokens, o[r0:r1])


def attention_decode(qkv, kv, page_table, pos, o, layer, layers, heads, kv_heads, head_dim, page_tokens):
    """One query row per sequence over its paged k/v."""
    pages = _pages(kv, layers, kv_heads, page_tokens, head_dim)
    for r in range(len(pos)):
        q = qkv[r:r + 1, : heads * head_dim].reshape(1, heads, head_dim)
        _attend(q, pos[r:r + 1], pages, page_table[r], layer, heads, kv_heads, head_dim, page_tokens, o[r:r + 1])


def silu_mul(gate_up, h):
    inter = h.shape[1]
    g = gate_up[:, :inter]
    np.negative(g, out=h)
    np.exp(h, out=h)
    h += 1.0
    np.divide(g, h, out=h)
    h *= gate_up[:, inter:]


def gather_last(x, cu_seqlens, y):
    np.take(x, cu_seqlens[1:] - 1, axis=0, out=y)


def _mix64(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 (wrapping), as cuda/argmax.cu's mix64."""
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def sample(logits, temperature, key, mask, mask_row, tokens):
    """Each row's argmax, or at temperature T > 0 a draw from softmax(logits / T) by the
    Gumbel-max trick with noise hashed from the row's 64-bit key and the token index (the same
    formula as cuda/argmax.cu's sample_partial, so a key reproduces its draw). mask_row[r] = m > 0:
    row r draws only among the tokens set in row m - 1 of `mask` (bit t % 32 of word t // 32),
    as cuda/argmax.cu does (where no allowed logit is above -inf: among the -inf ones, else the
    NaN ones, as if at 0; where none is allowed, token 0)."""
    vocab = logits.shape[1]
    with np.errstate(over="ignore"):
        for r in range(logits.shape[0]):
            row = logits[r].astype(np.float32)
            t = np.float32(temperature[r])
            g = None
            if t > 0:
                k = np.uint64(int(key[r, 0]) & 0xFFFFFFFF) | (np.uint64(int(key[r, 1]) & 0xFFFFFFFF) << np.uint64(32))
                h = _mix64(k ^ _mix64(np.arange(row.shape[0], dtype=np.uint64)))
                # 23 bits, as cuda/argmax.cu (why there): u in [2^-24, 1 - 2^-24], the noise finite
                u = ((h >> np.uint64(41)).astype(np.float32) + np.float32(0.5)) * np.float32(1.0 / 8388608.0)
                g = -np.log(-np.log(u))
            m = int(mask_row[r])
            if m > 0:
                tokens[r] = _masked_pick(row, t, g, _allowed(mask[m - 1], vocab))
                continue
            if g is not None:
                row = row * (np.float32(1) / t) + g
            nan = np.isnan(row)  # NaN never wins, as on the device; a row of only NaN gives -1
            tokens[r] = -1 if nan.all() else np.argmax(np.where(nan, np.float32(-np.inf), row))


def _allowed(words, vocab: int) -> np.ndarray:
    """A mask row's bits as bool [vocab]: bit t % 32 of word t // 32 allows token t."""
    bits = np.unpackbits(np.ascontiguousarray(words, "<i4").view(np.uint8), bitorder="little")
    return bits[:vocab].astype(bool)


def _masked_pick(row, t, g, allowed) -> int:
    """The draw among the allowed tokens: those whose logit is above -inf at their logits (ties to
    the lowest); where there are none, the -inf ones, else the NaN ones, as if at logit 0 (greedy:
    the lowest, sampled: the noise alone); token 0 where none is allowed."""
    live = np.flatnonzero(allowed & (row > -np.inf))  # NaN compares false
    if live.size:
        val = row[live] * (np.float32(1) / t) + g[live] if g is not None else row[live]
        return int(live[np.argmax(val)])
    for tier in (allowed & (row == -np.inf), allowed & np.isnan(row)):
        some = np.flatnonzero(tier)
        if some.size:
            return int(some[np.argmax(g[some])]) if g is not None else int(some[0])
    return 0


def accept(ids, cu_seqlens, tokens, accepted):
    """A speculative round's acceptance: a sequence's rows are its last token and the tokens
    proposed after it, and tokens[r] is the target's token after row r (its argmax, or its
    draw keyed by the request). The proposal's first n tokens are kept while each equals the
    target's token before it: accepted[g] = that n. Keyed draws make this rejection sampling
    of a proposal that is one token a position (kept with the target's probability of it,
    else the target's draw among the rest), and the tokens a round keeps are those plain
    decoding would have drawn."""
    for g in range(accepted.shape[0]):
        lo, hi = int(cu_seqlens[g]), int(cu_seqlens[g + 1])
        n = 0
        while lo + n + 1 < hi and ids[lo + n + 1] == tokens[lo + n]:
            n += 1
        accepted[g] = n
