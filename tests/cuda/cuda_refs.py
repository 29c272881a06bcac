"""numpy references for the llama kernels, with the reference's bf16 rounding made explicit."""

from __future__ import annotations

import numpy as np
from ml_dtypes import bfloat16

BF16 = bfloat16


def rbf(a) -> np.ndarray:
    """Round to bf16 and back to fp32."""
    return np.asarray(a, dtype=np.float32).astype(BF16).astype(np.float32)


def f32(a) -> np.ndarray:
    return np.asarray(a).astype(np.float32)


def rand_bf16(rng, shape, scale=1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32).astype(BF16)


def rms_norm(x, w, eps):
    x = f32(x)
    var = np.mean(x.astype(np.float64) ** 2, axis=-1, keepdims=True)
    r = (1.0 / np.sqrt(var + eps)).astype(np.float32)
    return rbf(f32(w) * rbf(x * r))


def inv_freq(head_dim, theta, factor=0.0, low=1.0, high=4.0, orig=8192):
    """transformers' default / llama3 inv_freq, fp32 step by step."""
    expo = (np.arange(0, head_dim, 2).astype(np.float32) / np.float32(head_dim)).astype(np.float32)
    base = np.power(np.float64(theta), expo.astype(np.float64)).astype(np.float32)
    inv = (np.float32(1.0) / base).astype(np.float32)
    if factor > 0:
        f, lo, hi, old = np.float32(factor), np.float32(low), np.float32(high), np.float32(orig)
        low_wl, high_wl = old / lo, old / hi
        wl = np.float32(2 * np.pi) / inv
        inv_l = np.where(wl > low_wl, inv / f, inv).astype(np.float32)
        smooth = ((old / wl - lo) / (hi - lo)).astype(np.float32)
        smoothed = ((np.float32(1) - smooth) * inv_l / f + smooth * inv_l).astype(np.float32)
        medium = ~(wl < high_wl) & ~(wl > low_wl)
        inv = np.where(medium, smoothed, inv_l).astype(np.float32)
    return inv


def rope_table(max_pos, head_dim, inv):
    t = np.arange(max_pos, dtype=np.float32)[:, None] * inv[None, :]
    return np.concatenate([np.cos(t.astype(np.float64)), np.sin(t.astype(np.float64))], axis=1).astype(np.float32)


def rope_heads(x, pos, table):
    """x [rows, heads, head_dim] fp32 (bf16 values) -> rotated, rounded as transformers does."""
    half = x.shape[-1] // 2
    c = rbf(table[pos, :half])[:, None, :]
    s = rbf(table[pos, half:])[:, None, :]
    x0, x1 = x[..., :half], x[..., half:]
    y0 = rbf(rbf(x0 * c) - rbf(x1 * s))
    y1 = rbf(rbf(x1 * c) + rbf(x0 * s))
    return np.concatenate([y0, y1], axis=-1)


def ulp_diff(a, b) -> np.ndarray:
    """Distance in bf16 units in the last place between two bf16-valued arrays."""
    ia = np.asarray(a, np.float32).astype(BF16).view(np.int16).astype(np.int32)
    ib = np.asarray(b, np.float32).astype(BF16).view(np.int16).astype(np.int32)
    ia = np.where(ia < 0, -32768 - ia, ia)  # sign-magnitude -> ordered
    ib = np.where(ib < 0, -32768 - ib, ib)
    return np.abs(ia - ib)
