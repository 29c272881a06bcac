"""CPU kernels of the Kimi-Linear family's own ops: numpy, fp32 storage and accumulation (the
reference). The rest of a layer is the llama module's (norms, linears, SwiGLU, sampling) and
the Qwen3-MoE module's (experts, combine).

This file is a kern module, pinned by sha256 like a cubin.

KDA (Kimi Delta Attention), a layer's per-sequence state, one slot of the `kda` state (of
slot_bytes, the used part first) holding every KDA layer's part, [layer][recurrent | window] in f32:
  recurrent  [heads, dim, dim]  S, the gated delta rule's state (key dim x value dim)
  window     [conv - 1, 3 * heads * dim]  the last conv - 1 inputs of the short convolution
A sequence whose rows start at position 0 starts from zeros, whatever its slot holds: a slot
needs no clearing between sequences. Each token t of a head:
  S <- diag(exp(g_t)) S;  S <- S + beta_t k_t (v_t - S^T k_t)^T;  o_t = S^T q_t
with q and k L2-normed (q also scaled by dim^-1/2), g_t <= 0 the per-channel log decay.
Two forms of the prompt's recurrence: `kda_chunked`, chunk by chunk (`chunk` rows: within a
chunk a triangular solve, then one pass over the state per chunk; the form sm_90a's prefill
kernel computes), and `kda_tokens`, a token at a time through exactly decode's one-token step
(`_step`). The cpu deployment's prefill takes `kda_tokens` (docs/determinism.md): a token's bits
are then the same in a prompt cut anywhere, in one-token decode (a cached prompt's last token)
and in any batch, because every token goes through the same calls of the same shapes. The
chunked form's bits depend on where the prompt was cut (the chunk's triangular solve and its
state update sum the chunk's rows in one order); the two agree up to rounding.

MLA (multi-head latent attention), the paged `kv` state, a page (of page_tokens x token_bytes,
the used part first) [layer][token][latent | key]:
the RMS-normed compressed latent (kv_lora wide) and the shared key part (rope wide; Kimi-Linear
rotates nothing). Prefill expands the latent into each head's keys and values with kv_b;
decode attends over the latent itself, kv_b's key half absorbed into the query and its value
half applied after (the same attention, reassociated).
"""

import numpy as np

F32 = np.float32


# ---- KDA ----------------------------------------------------------------------------------

def _kda_slots(state, layer, layers, heads, dim, conv, slot_bytes):
    """Views of every slot's recurrent state [slots, heads, dim, dim] and conv window
    [slots, conv - 1, 3 * heads * dim] of KDA layer `layer`."""
    rec = heads * dim * dim
    per = rec + (conv - 1) * 3 * heads * dim
    s = state.view(F32).reshape(-1, slot_bytes // 4)[:, :layers * per].reshape(-1, layers, per)[:, layer]
    return s[:, :rec].reshape(-1, heads, dim, dim), s[:, rec:].reshape(-1, conv - 1, 3 * heads * dim)


def _silu(x):
    return x / (F32(1) + np.exp(-x))


def _conv_rows(x, window, w):
    """The causal depthwise convolution of rows x [n, c] after `window` [k - 1, c]: its output
    rows (SiLU applied) and the new window."""
    k = w.shape[1]
    ext = np.concatenate([window, x])
    out = np.zeros_like(x)
    for j in range(k):
        out += ext[j:j + len(x)] * w[:, j]
    return _silu(out), ext[len(ext) - (k - 1):]


def kda_conv(mix, w, state, slot, cu_seqlens, pos, layer, layers, heads, dim, conv, slot_bytes):
    """mix [rows, 3 * heads * dim] (q | k | v projections), in place: each sequence's rows
    convolved after its window (zeros at position 0), the window advanced."""
    _, win = _kda_slots(state, layer, layers, heads, dim, conv, slot_bytes)
    w = w.reshape(mix.shape[1], conv)
    for s in range(len(cu_seqlens) - 1):
        r0, r1 = int(cu_seqlens[s]), int(cu_seqlens[s + 1])
        if r1 == r0:
            continue
        start = np.zeros_like(win[0]) if pos[r0] == 0 else win[slot[s]]
        mix[r0:r1], win[slot[s]] = _conv_rows(mix[r0:r1].copy(), start, w)


def kda_conv_decode(mix, w, state, slot, pos, layer, layers, heads, dim, conv, slot_bytes):
    """kda_conv for one row a sequence (row r belongs to sequence r)."""
    kda_conv(mix, w, state, slot, np.arange(len(pos) + 1), pos, layer, layers, heads, dim, conv, slot_bytes)


def _exact(fn, x):
    """fn (np.exp, np.log) of f32 x, correctly rounded to f32: numpy's own f32 versions differ
    with the machine's SIMD path (a third of exp's results an ulp or more off), and the gate's
    output is judged at f32 against kernels that round exactly."""
    return fn(x.astype(np.float64)).astype(F32)


def kda_gate(f, a_log, dt_bias, heads):
    """f [rows, heads * dim] (the forget gate's low-rank projection), in place: the log decay
    g = -exp(A_log[head]) * softplus(f + dt_bias), softplus(x) = x above 20."""
    x = f + dt_bias
    with np.errstate(over="ignore"):
        sp = np.where(x > 20, x, _exact(np.log, F32(1) + _exact(np.exp, x)))
    f[:] = -(_exact(np.exp, a_log).repeat(f.shape[1] // heads) * sp)


def _l2(x):
    return x / np.sqrt((x * x).sum(-1, keepdims=True) + F32(1e-6))


def _qkv(mix, rows, heads, dim):
    """q (L2-normed and scaled), k (L2-normed) and v of rows, each [n, heads, dim]."""
    width = heads * dim
    q, k, v = (mix[rows, i * width:(i + 1) * width].reshape(-1, heads, dim) for i in range(3))
    return _l2(q) * F32(dim ** -0.5), _l2(k), v


def _chunk(S, q, k, v, g, beta):
    """One chunk of n rows of every head ([heads, n, dim]; beta [heads, n]) from state S
    [heads, dim, dim]: the chunk's outputs [heads, n, dim] and the state after it."""
    n = q.shape[1]
    gc = np.cumsum(g, axis=1)                                        # log decay since the chunk began
    lower = np.tril(np.ones((n, n), bool), -1)
    causal = np.tril(np.ones((n, n), bool))
    diff = gc[:, :, None, :] - gc[:, None, :, :]                     # [h, i, j, d]: decay from j to i
    decay = np.exp(np.where(causal[None, :, :, None], diff, -np.inf)).astype(F32)
    kb = k * beta[..., None]
    # T = (I - M)^-1 with M[i, j] = -beta_i sum_d k_i k_j decay (j < i), by forward substitution
    T = np.where(lower, -np.einsum("hid,hjd,hijd->hij", kb, k, decay), F32(0)).astype(F32)
    for i in range(1, n):
        T[:, i, :i] += np.einsum("hj,hjk->hk", T[:, i, :i], T[:, :i, :i])
    T += np.eye(n, dtype=F32)
    u = T @ (v * beta[..., None])                                    # the chunk's corrected values
    w = T @ (kb * np.exp(gc))                                        # their dependence on S
    v_new = u - w @ S
    inter = (q * np.exp(gc)) @ S
    intra = np.where(causal, np.einsum("hid,hjd,hijd->hij", q, k, decay), F32(0)).astype(F32)
    o = inter + intra @ v_new
    last = gc[:, -1:, :]                                             # [h, 1, d]
    S = S * np.exp(last).transpose(0, 2, 1) + (k * np.exp(last - gc)).transpose(0, 2, 1) @ v_new
    return o, S


def kda_chunked(mix, g, b, state, slot, cu_seqlens, pos, o, layer, layers, heads, dim, conv, slot_bytes, chunk):
    """Prefill: each sequence's rows through the recurrence, `chunk` rows at a time, from its
    slot's state (zeros at position 0); the state after its last row written back.
    mix: convolved q | k | v; g [rows, heads * dim] log decay; b [rows, heads] beta's logits;
    o [rows, heads * dim]."""
    def chunks(S, r0, r1):
        for c0 in range(r0, r1, chunk):
            rows = slice(c0, min(c0 + chunk, r1))
            q, k, v = (x.transpose(1, 0, 2) for x in _qkv(mix, rows, heads, dim))
            gh = g[rows].reshape(-1, heads, dim).transpose(1, 0, 2)
            beta = (F32(1) / (F32(1) + np.exp(-b[rows]))).T
            out, S = _chunk(S, q, k, v, gh, beta)
            o[rows] = out.transpose(1, 0, 2).reshape(-1, heads * dim)
        return S

    _sequences(chunks, state, slot, cu_seqlens, pos, layer, layers, heads, dim, conv, slot_bytes)


def _sequences(fold, state, slot, cu_seqlens, pos, layer, layers, heads, dim, conv, slot_bytes):
    """Each sequence's rows [r0, r1) folded into its slot's recurrent state by fold(S, r0, r1)
    (which returns the state after them), from zeros at position 0."""
    rec, _ = _kda_slots(state, layer, layers, heads, dim, conv, slot_bytes)
    for s in range(len(cu_seqlens) - 1):
        r0, r1 = int(cu_seqlens[s]), int(cu_seqlens[s + 1])
        if r1 > r0:
            rec[slot[s]] = fold(np.zeros_like(rec[0]) if pos[r0] == 0 else rec[slot[s]].copy(), r0, r1)


def _step(S, q, k, v, g, b):
    """One token of each of n sequences, every head, S [n, heads, dim, dim] updated in place:
    the outputs [n, heads, dim]. Each reduction is a matmul a (sequence, head) of one shape
    ([1, dim] @ [dim, dim]: numpy hands BLAS the stacked items one at a time) and the rest
    element-wise (exp and the sigmoid correctly rounded), so a token's bits depend on its
    values and its S alone, never on how many tokens or sequences share the call."""
    S *= _exact(np.exp, g)[..., None]
    beta = F32(1) / (F32(1) + _exact(np.exp, -b))
    delta = (v - (k[..., None, :] @ S)[..., 0, :]) * beta[..., None]
    S += k[..., None] * delta[..., None, :]
    return (q[..., None, :] @ S)[..., 0, :]


def kda_tokens(mix, g, b, state, slot, cu_seqlens, pos, o, layer, layers, heads, dim, conv, slot_bytes):
    """Prefill, the cpu deployment's: each sequence's rows a token at a time through decode's
    step (`_step`), from its slot's state (zeros at position 0), the state written back. The
    same arguments as kda_chunked but the chunk."""
    def tokens(S, r0, r1):
        q, k, v = _qkv(mix, slice(r0, r1), heads, dim)               # [n, heads, dim]
        gh = g[r0:r1].reshape(-1, heads, dim)
        bs = b[r0:r1]
        for t in range(r1 - r0):  # a token at a time: S[None] is this sequence's state, one of one
            one = slice(t, t + 1)
            o[r0 + t] = _step(S[None], q[one], k[one], v[one], gh[one], bs[one]).reshape(-1)
        return S

    _sequences(tokens, state, slot, cu_seqlens, pos, layer, layers, heads, dim, conv, slot_bytes)


def kda_step(mix, g, b, state, slot, pos, o, layer, layers, heads, dim, conv, slot_bytes):
    """Decode: one token a sequence (row r is sequence r's), the recurrence's one-token step
    (_step, as kda_tokens takes each prompt token through it)."""
    rec, _ = _kda_slots(state, layer, layers, heads, dim, conv, slot_bytes)
    S = rec[slot].copy()                                             # [n, heads, dim, dim]
    S[pos == 0] = 0
    q, k, v = _qkv(mix, slice(None), heads, dim)                      # [n, heads, dim]
    o[:] = _step(S, q, k, v, g.reshape(-1, heads, dim), b).reshape(len(pos), -1)
    rec[slot] = S


def kda_out_norm(o, gate, w, y, heads, eps):
    """y = each head of o RMS-normed, times w, times sigmoid(gate)."""
    n = o.shape[0]
    x = o.reshape(n, heads, -1)
    x = x / np.sqrt((x * x).mean(-1, keepdims=True) + F32(eps)) * w
    y[:] = x.reshape(n, -1) / (F32(1) + np.exp(-gate))


# ---- MLA ----------------------------------------------------------------------------------

def _mla_pages(kv, layers, page_tokens, width, token_bytes):
    used = layers * page_tokens * width
    return kv.view(F32).reshape(-1, page_tokens * token_bytes // 4)[:, :used].reshape(-1, layers, page_tokens, width)


def mla_append(ckv, norm_w, kv, page_table, cu_seqlens, pos, layer, layers, kv_lora, rope, page_tokens, token_bytes,
               eps):
    """ckv [rows, kv_lora + rope] (kv_a's output): each row's latent RMS-normed (norm_w) and its
    key part written at its position in its sequence's pages."""
    pages = _mla_pages(kv, layers, page_tokens, kv_lora + rope, token_bytes)
    lat = ckv[:, :kv_lora]
    normed = lat / np.sqrt((lat * lat).mean(-1, keepdims=True) + F32(eps)) * norm_w
    for s in range(len(cu_seqlens) - 1):
        r0, r1 = int(cu_seqlens[s]), int(cu_seqlens[s + 1])
        p = pos[r0:r1]
        phys = page_table[s][p // page_tokens]
        pages[phys, layer, p % page_tokens, :kv_lora] = normed[r0:r1]
        pages[phys, layer, p % page_tokens, kv_lora:] = ckv[r0:r1, kv_lora:]


def mla_append_decode(ckv, norm_w, kv, page_table, pos, layer, layers, kv_lora, rope, page_tokens, token_bytes,
                      eps):
    """mla_append for one row a sequence (row r belongs to sequence r)."""
    mla_append(ckv, norm_w, kv, page_table, np.arange(len(pos) + 1), pos, layer, layers, kv_lora, rope,
               page_tokens, token_bytes, eps)


def _cached(pages, table, layer, ctx, page_tokens, kv_lora):
    """A sequence's first ctx cached rows: latents [ctx, kv_lora] and key parts [ctx, rope]."""
    npg = -(-ctx // page_tokens)
    rows = pages[table[:npg], layer].reshape(npg * page_tokens, -1)[:ctx]
    return rows[:, :kv_lora], rows[:, kv_lora:]


def _softmax_rows(s):
    s = s - s.max(-1, keepdims=True)
    np.exp(s, out=s)
    return s / s.sum(-1, keepdims=True)


def _mla_row(q, pages, table, p, wb, o, layer, heads, nope, rope, kv_lora, page_tokens):
    """One query row at position p attends over its sequence's first p + 1 latents with kv_b
    absorbed: the query's key half mapped into latent space (q_nope @ kv_b's key half), scores
    against the latents plus the key part's, the weighted latent mapped out through kv_b's
    value half. Every call's shape is set by p and the weights alone (no mask, no padding)."""
    lat, kr = _cached(pages, table, layer, p + 1, page_tokens, kv_lora)
    qh = q.reshape(heads, nope + rope)
    q_lat = np.einsum("hd,hdc->hc", qh[:, :nope], wb[:, :nope])
    a = _softmax_rows((q_lat @ lat.T + qh[:, nope:] @ kr.T) * F32((nope + rope) ** -0.5))   # [heads, ctx]
    o[:] = np.einsum("hc,hdc->hd", a @ lat, wb[:, nope:]).reshape(-1)


EXPAND_KEYS = 16  # keys expanded a call of the einsum: the block is fixed, so is each key's expansion


def _mla_expanded(pages, table, layer, ctx, wb, nope, kv_lora, page_tokens):
    """A sequence's first ctx latents expanded through kv_b into each head's keys and values:
    k [heads, ctx, nope], v [heads, ctx, v_dim], and its key parts [ctx, rope]. The latents
    go in blocks of EXPAND_KEYS keys from key 0 (the last block zero-padded), one einsum a
    block, so a key's expansion is the same bits whatever ctx a call expands (an output row of
    the einsum sums that key's latent alone) and each key is expanded once a call."""
    lat, kr = _cached(pages, table, layer, ctx, page_tokens, kv_lora)
    blocks = -(-ctx // EXPAND_KEYS)
    padded = np.zeros((blocks * EXPAND_KEYS, kv_lora), F32)
    padded[:ctx] = lat
    kvx = np.concatenate([np.einsum("tc,hdc->htd", padded[b * EXPAND_KEYS:(b + 1) * EXPAND_KEYS], wb)
                          for b in range(blocks)], axis=1)[:, :ctx]
    return kvx[..., :nope], kvx[..., nope:], kr


def _mla_row_expanded(q, k, v, kr, p, o, heads, nope, rope):
    """One prompt row at position p in the expanded form (transformers'): its query against
    the first p + 1 expanded keys (_mla_expanded) plus the key parts, the weighted values out.
    A third of the absorbed form's arithmetic a key (nope + rope + v_dim against kv_lora +
    rope + kv_lora a head), what a long prompt's prefill wants; every call's shape set by p."""
    qh = q.reshape(heads, nope + rope)
    a = _softmax_rows((np.einsum("hd,htd->ht", qh[:, :nope], k[:, :p + 1]) + qh[:, nope:] @ kr[:p + 1].T)
                      * F32((nope + rope) ** -0.5))
    o[:] = np.einsum("ht,htd->hd", a, v[:, :p + 1]).reshape(-1)


def mla_attention(q, kv, page_table, cu_seqlens, pos, prompt_len, kv_b, o, layer, layers, heads, nope, rope, v_dim,
                  kv_lora, page_tokens, token_bytes):
    """Prefill: each sequence's rows (q [rows, heads * (nope + rope)]) attend causally to its
    cached rows, o [rows, heads * v_dim], a row at a time in the form its role fixes: a prompt
    token (a position below its sequence's prompt_len) expanded (_mla_row_expanded, over the
    sequence's keys expanded once for the call), a generated one fed again (a preempted request
    recomputed) absorbed through decode's arithmetic (_mla_row). So a token's bits are the same
    in a chunk of any size, beside any rows, and a generated token's are decode's; a prompt
    token's differ from what decode would give it, and the prefix cache keys the roles apart
    (kern.generation.sequence.GENERATED)."""
    pages = _mla_pages(kv, layers, page_tokens, kv_lora + rope, token_bytes)
    wb = kv_b.reshape(heads, nope + v_dim, kv_lora)
    for s in range(len(cu_seqlens) - 1):
        rows = range(int(cu_seqlens[s]), int(cu_seqlens[s + 1]))
        prompt = [r for r in rows if int(pos[r]) < int(prompt_len[s])]
        if prompt:
            k, v, kr = _mla_expanded(pages, page_table[s], layer, int(pos[prompt[-1]]) + 1, wb, nope, kv_lora,
                                     page_tokens)
        for r in rows:
            p = int(pos[r])
            if p < int(prompt_len[s]):
                _mla_row_expanded(q[r], k, v, kr, p, o[r], heads, nope, rope)
            else:
                _mla_row(q[r], pages, page_table[s], p, wb, o[r], layer, heads, nope, rope, kv_lora, page_tokens)


def mla_attention_decode(q, kv, page_table, pos, kv_b, o, layer, layers, heads, nope, rope, v_dim, kv_lora,
                         page_tokens, token_bytes):
    """Decode: one row a sequence (_mla_row)."""
    pages = _mla_pages(kv, layers, page_tokens, kv_lora + rope, token_bytes)
    wb = kv_b.reshape(heads, nope + v_dim, kv_lora)
    for r in range(len(pos)):
        _mla_row(q[r], pages, page_table[r], int(pos[r]), wb, o[r], layer, heads, nope, rope, kv_lora, page_tokens)


# ---- MoE router and the shared expert's sum -------------------------------------------------

def route(logits, bias, ids, weights, scaling, norm_topk, groups, topk_groups):
    """Sigmoid scores; experts chosen by score + bias (the bias steers selection only) among
    the topk_groups groups whose two best biased scores sum highest; weights = the unbiased
    scores of the chosen, renormalized when norm_topk, times scaling. Ties go to the lowest
    index (stable sorts)."""
    k = ids.shape[1]
    scores = F32(1) / (F32(1) + np.exp(-logits))
    choice = scores + bias
    rows, experts = choice.shape
    if groups > 1:
        g = choice.reshape(rows, groups, experts // groups)
        best2 = -np.sort(-g, axis=-1, kind="stable")[..., :2].sum(-1)
        keep = np.argsort(-best2, axis=1, kind="stable")[:, :topk_groups]
        mask = np.zeros((rows, groups), bool)
        np.put_along_axis(mask, keep, True, axis=1)
        choice = np.where(mask.repeat(experts // groups, axis=1), choice, F32(-np.inf))
    top = np.argsort(-choice, axis=1, kind="stable")[:, :k]
    w = np.take_along_axis(scores, top, axis=1)
    if norm_topk:
        w = w / (w.sum(axis=1, keepdims=True) + F32(1e-20))
    ids[:] = top
    weights[:] = w * F32(scaling)


def add(x, y):
    """x += y (the shared experts' output onto the routed experts')."""
    x += y
