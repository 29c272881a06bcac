"""CPU kernels of the Qwen3-MoE block: numpy, fp32 storage and accumulation (the reference).

This file is a kern module, pinned by sha256 like a cubin. A sparse layer's MLP is four calls:
the router's logits (the llama module's `linear`), `route` (softmax over every expert, the
top k, optionally renormalized), `experts` (each expert on the rows routed to it: SwiGLU MLP,
one output a (row, choice)) and `combine` (each row's outputs summed with their weights, in
choice order). The expert weights are one buffer a layer: the experts' [gate; up] rows stacked
[experts * 2 * inter, hidden], their down rows [experts * hidden, inter].

The arithmetic of an expert on a row is fixed by that row alone: a gemv a (row, choice), never
one gemm over the rows routed to it (a BLAS picks its kernel by the number of rows, so a row's
bits would change with the step's routing). So a row's bits are the same whatever rank holds
its experts (expert parallel gives the single device's bits) and whatever else the step holds
(batch invariance, docs/determinism.md).
"""

import numpy as np


def route(logits, ids, weights, norm_topk):
    """ids[r] = the top_k experts of row r by softmax probability, ties to the lowest expert
    index; weights[r] = their probabilities (divided by their sum when norm_topk)."""
    k = ids.shape[1]
    p = logits - logits.max(axis=1, keepdims=True)
    np.exp(p, out=p)
    p /= p.sum(axis=1, keepdims=True)
    # a stable sort of -p keeps equal probabilities in index order: the lowest index wins a tie
    top = np.argsort(-p, axis=1, kind="stable")[:, :k]
    w = np.take_along_axis(p, top, axis=1)
    if norm_topk:
        w = w / w.sum(axis=1, keepdims=True)
    ids[:] = top
    weights[:] = w


def _silu_mul(gu, inter):
    g, u = gu[:, :inter], gu[:, inter:]
    return g / (np.float32(1) + np.exp(-g)) * u


def experts(x, ids, gate_up, down, y, first, count):
    """y[r, j] = expert ids[r, j] applied to x[r], for the experts first .. first + count - 1
    this buffer holds; every other (row, choice) of y is zero (another rank computes it)."""
    rows, hidden = x.shape
    inter = down.shape[1]
    gu_w = gate_up.reshape(count, 2 * inter, hidden)
    d_w = down.reshape(count, hidden, inter)
    y[:] = 0
    for e in range(count):
        for r, j in zip(*np.nonzero(ids == first + e)):
            h = _silu_mul((gu_w[e] @ x[r])[None], inter)[0]
            np.matmul(d_w[e], h, out=y[r, j])


def combine(y, weights, out):
    """out[r] = sum over j of weights[r, j] * y[r, j], in choice order."""
    out[:] = 0
    for j in range(y.shape[1]):
        out += weights[:, j:j + 1] * y[:, j]
