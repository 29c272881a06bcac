"""KDA's position-chunked recurrence on tensor cores (kernels/cuda/kda_tc.cu) off the GPU: a
numpy model of the kernel's order, a float64 token-by-token reference, and the state a sequence
keeps between calls, shared by the CPU tests (test_kda_tc_model.py), the GPU tests
(test_cuda_gpu_kda_tc.py) and the timing probe (bench/probes/kda_tc.py).

The order (one (sequence, head); C = 16 rows a chunk; chunk boundaries at multiples of C of
the position, so a token at position p is row p % C of chunk p // C wherever its prompt was
cut). A call computes rows [t0, t1) of a chunk from what the slot keeps:

  S0                 the state at the chunk's start (moves on only at the chunk's end)
  K, G, VN [C, D]    for the chunk's rows so far: k (L2-normed), gc (the log decay summed
                     from the chunk's start), v' (the corrected value, delta_t of the rule)

and for each new row i (the new rows' inputs q, k, v, g, b):

  q_i, k_i   L2-normed (a warp a row: lane l sums d = l, l + 32, ... by fma, then the xor
             butterfly), q_i scaled by 1 / sqrt(D)
  gc_i       gc_{i-1} + g_i (g_0 at row 0)
  XS         [k_i exp(gc_i); q_i exp(gc_i)] (rows of 2 m16 tiles, every other row zero) @ S0 on
             mma.sync m16n8k16 bf16 in three products a k16 step (each f32 operand split hi + lo
             in bf16: lo*hi, hi*lo, hi*hi, in that order, into one f32 accumulator), k16 steps
             in order from channel 0
  A[i, j]    sum_d k_i k_j exp(gc_i - gc_j) (j < i), P[i, j] sum_d q_i k_j exp(gc_i - gc_j)
             (j <= i): a warp a pair (two at a time), the norm's lane order
  v'_i       beta_i (v_i - XS_k[i] - sum_{j < i} A[i, j] v'_j), j from 0 by fma
  o_i        XS_q[i] + sum_{j <= i} P[i, j] v'_j, j from 0 by fma

and when the call completes the chunk (t1 = C), the state moves on by the chunk's update:
  S <- exp(gc_last) S0 + (k exp(gc_last - gc))^T v'   (one k16 step over the chunk's rows,
       the accumulator starting at exp(gc_last) S0, the same three split products)

Each row's arithmetic reads its own inputs, S0 and the rows before it only, and an mma sums a
row's products from that row alone (rows not computed are zeros, which add nothing), so a row
gets the same bits in a whole chunk, in a chunk finished over several calls and in a decode
step. What the model cannot know is the mma's own sum of a k16 step (the hardware's): it adds
the 16 exact products and the accumulator in float64 and rounds once; nor expf's last ulp (it
takes float64 exp rounded): it predicts the kernel within rounding, not to the bit, while its
own bits are as cut-invariant as the kernel's are meant to be."""

from __future__ import annotations

import numpy as np

C = 16          # kda_tc.cu KDA_TC_C: rows a chunk (one m16 tile, one k16 step over the rows)
K16 = 16
F32 = np.float32


def bf16_round(x: np.ndarray) -> np.ndarray:
    """f32 -> bf16 -> f32, round to nearest even (__float2bfloat16_rn)."""
    u = np.ascontiguousarray(x, F32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return (r & 0xFFFFFFFF).astype(np.uint32).view(F32).reshape(np.shape(x))


def split(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """An f32 operand as hi + lo in bf16 (kda_tc.cu split2): hi = bf16(x), lo = bf16(x - hi)."""
    x = np.asarray(x, F32)
    hi = bf16_round(x)
    return hi, bf16_round((x - hi).astype(F32))


def mma(acc: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """One k16 step: acc [m, n] f32 + a [m, 16] @ b [16, n] (bf16 values), the products exact
    and summed with the accumulator in float64, rounded once to f32 (the model's stand-in for
    the hardware's sum)."""
    return (acc.astype(np.float64) + a.astype(np.float64) @ b.astype(np.float64)).astype(F32)


def mma3(acc: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """acc + a @ b over k in k16 steps from 0, each step the three split products lo*hi, hi*lo,
    hi*hi (the kernel's order); a [m, K], b [K, n] f32, K a multiple of 16."""
    ah, al = split(a)
    bh, bl = split(b)
    for k0 in range(0, a.shape[1], K16):
        ks = slice(k0, k0 + K16)
        acc = mma(acc, al[:, ks], bh[ks])
        acc = mma(acc, ah[:, ks], bl[ks])
        acc = mma(acc, ah[:, ks], bh[ks])
    return acc


def fma(a, b, c):
    """f32 fma (the product exact in float64, one rounding: double rounding aside)."""
    return (np.float64(a) * np.float64(b) + np.float64(c)).astype(F32) if np.ndim(c) else \
        F32(np.float64(a) * np.float64(b) + np.float64(c))


def warp_dot(x: np.ndarray, y: np.ndarray) -> F32:
    """sum_d x_d y_d as a warp sums it: lane l takes d = l, l + 32, ... by fma, then the xor
    butterfly (16, 8, 4, 2, 1), every lane the same value."""
    D = len(x)
    p = np.zeros(32, F32)
    for m in range(0, D, 32):
        n = min(32, D - m)
        p[:n] = (p[:n].astype(np.float64) + x[m:m + n].astype(np.float64) * y[m:m + n].astype(np.float64)).astype(F32)
    lanes = np.arange(32)
    for o in (16, 8, 4, 2, 1):
        p = (p + p[lanes ^ o]).astype(F32)
    return p[0]


def exp32(x) -> np.ndarray:
    """expf's stand-in: float64 exp rounded to f32."""
    return np.exp(np.asarray(x, np.float64)).astype(F32)


class Slot:
    """What a sequence keeps of one head between calls: S0 (the state at its chunk's start) and
    the chunk's rows so far (K, G, VN); n the rows kept (position % C)."""

    def __init__(self, D: int):
        self.S = np.zeros((D, D), F32)
        self.K, self.G, self.VN = (np.zeros((C, D), F32) for _ in range(3))

    def copy(self) -> "Slot":
        s = Slot(self.S.shape[0])
        s.S, s.K, s.G, s.VN = self.S.copy(), self.K.copy(), self.G.copy(), self.VN.copy()
        return s


def chunk_rows(slot: Slot, t0: int, q, k, v, g, b) -> np.ndarray:
    """Rows t0 .. t0 + n - 1 of the slot's chunk (q, k, v, g [n, D] f32: q, k, v bf16 values;
    b [n] beta's logits), the slot updated in place (the rows kept, or at the chunk's end the
    state moved on). Returns o [n, D] f32 (the kernel rounds it to bf16 as it writes)."""
    n, D = q.shape
    t1 = t0 + n
    assert 0 <= t0 < t1 <= C and D % K16 == 0
    K, G, VN = slot.K, slot.G, slot.VN
    K[t0:], G[t0:], VN[t0:] = 0, 0, 0
    Q = np.zeros((C, D), F32)
    beta = np.zeros(C, F32)
    qscale = F32(1) / np.sqrt(F32(D))
    for t in range(n):
        i = t0 + t
        rq = qscale / np.sqrt(warp_dot(q[t], q[t]) + F32(1e-6))
        rk = F32(1) / np.sqrt(warp_dot(k[t], k[t]) + F32(1e-6))
        Q[i], K[i] = (q[t] * rq).astype(F32), (k[t] * rk).astype(F32)
        beta[i] = F32(1) / (F32(1) + exp32(-F32(b[t])))
        G[i] = g[t] if i == 0 else (G[i - 1] + g[t]).astype(F32)
    X = np.zeros((2 * C, D), F32)
    eg = exp32(G[t0:t1])
    X[t0:t1] = K[t0:t1] * eg
    X[C + t0:C + t1] = Q[t0:t1] * eg
    XS = mma3(np.zeros((2 * C, D), F32), X, slot.S)
    o = np.zeros((n, D), F32)
    for i in range(t0, t1):
        acc = (v[i - t0] - XS[i]).astype(F32)
        for j in range(i):
            kd = (K[j] * exp32(G[i] - G[j])).astype(F32)
            acc = fma(-warp_dot(K[i], kd), VN[j], acc)
        VN[i] = (beta[i] * acc).astype(F32)
        out = XS[C + i]
        for j in range(i + 1):
            kd = (K[j] * exp32(G[i] - G[j])).astype(F32)
            out = fma(warp_dot(Q[i], kd), VN[j], out)
        o[i - t0] = out
    if t1 == C:
        last = G[C - 1]
        kd = (K * exp32(last - G)).astype(F32)                      # [C, D]: rows j, channels e
        acc = (slot.S * exp32(last)[:, None]).astype(F32)
        slot.S = mma3(acc, kd.T.copy(), VN)
    return o


def run(slot: Slot, pos0: int, q, k, v, g, b) -> np.ndarray:
    """A call over a sequence's rows at positions pos0 .. pos0 + n - 1 (its chunks' parts in
    order), from the slot (zeros at position 0). Returns o [n, D] f32."""
    n = len(q)
    if pos0 == 0:
        slot.__init__(q.shape[1])
    out, r = [], 0
    while r < n:
        t0 = (pos0 + r) % C
        m = min(C - t0, n - r)
        out.append(chunk_rows(slot, t0, q[r:r + m], k[r:r + m], v[r:r + m], g[r:r + m], b[r:r + m]))
        r += m
    return np.concatenate(out)


def reference(q, k, v, g, b) -> tuple[np.ndarray, np.ndarray]:
    """float64 token-by-token gated delta rule of one head from zero state: o [n, D] and the
    state after the last row."""
    q, k, v, g, b = (np.asarray(x, np.float64) for x in (q, k, v, g, b))
    D = q.shape[1]
    q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6) / np.sqrt(D)
    k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
    S = np.zeros((D, D))
    o = np.zeros_like(q)
    for t in range(len(q)):
        S *= np.exp(g[t])[:, None]
        beta = 1 / (1 + np.exp(-b[t]))
        S += np.outer(k[t], beta * (v[t] - k[t] @ S))
        o[t] = q[t] @ S
    return o, S


def state_after(slot: Slot, pos: int, D: int) -> np.ndarray:
    """The recurrent state after position pos - 1 in float64 from what the slot keeps (S0 and
    the chunk's rows so far): S0 decayed to the last kept row plus its rows' updates."""
    n = pos % C
    S = slot.S.astype(np.float64)
    if n == 0:
        return S
    G = slot.G[:n].astype(np.float64)
    last = G[n - 1]
    return S * np.exp(last)[:, None] + (slot.K[:n] * np.exp(last - G)).T @ slot.VN[:n].astype(np.float64)


def inputs(rng: np.random.Generator, n: int, D: int, decay: float = 1.0) -> tuple:
    """A head's random rows: q, k, v bf16 values (f32), g <= 0 (log decays about -decay / 8 a
    token, per channel), b beta's logits."""
    qkv = [bf16_round(rng.standard_normal((n, D)).astype(F32)) for _ in range(3)]
    g = (-np.abs(rng.standard_normal((n, D))) * decay / 8).astype(F32)
    b = rng.standard_normal(n).astype(F32)
    return (*qkv, g, b)
