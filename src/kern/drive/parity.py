"""Logits compared the way the parity tests and the benchmarks judge them: KL, argmax agreement
away from near-ties; and a model's logits at every position, teacher-forced."""

from __future__ import annotations

import numpy as np

from .raw_pages import raw


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def compare(ref: np.ndarray, got: np.ndarray, noise: float = 1e-2) -> dict:
    """Per-row KL(ref || got) (its mean, 99th percentile and max), argmax agreement on rows
    whose reference top-1/top-2 margin exceeds `noise` (bf16 noise of the logits), and how many
    rows were decisive."""
    lp, lq = log_softmax(ref), log_softmax(got)
    kl = (np.exp(lp) * (lp - lq)).sum(axis=-1)
    top2 = np.sort(ref, axis=-1)[:, -2:]
    decisive = (top2[:, 1] - top2[:, 0]) > noise
    agree = ref.argmax(-1) == got.argmax(-1)
    return {"mean_kl": float(kl.mean()), "p99_kl": float(np.quantile(kl, 0.99)), "max_kl": float(kl.max()),
            "agree_decisive": float(agree[decisive].mean()) if decisive.any() else 1.0,
            "decisive": int(decisive.sum()), "rows": len(ref)}


def teacher_forced(model, ids: list[int]) -> np.ndarray:
    """kern's logits at every position, fed one token at a time through the decode program
    (model: a kern.api.Model, or anything with its paging, protocol and engine)."""
    pages = raw(model).take(-(-len(ids) // model.page_tokens))
    try:
        return np.stack([raw(model).step_rows([t], i, pages)[1] for i, t in enumerate(ids)])
    finally:
        raw(model).give(pages)
