"""Sampling on the host, vectorized over the rows of a step that read logits: penalties,
temperature, top_k, top_p, min_p, then one draw per row from that request's own generator.
(On the device it needs sampling kernels; until then greedy rows take the device's argmax.)"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import numpy as np

from .outputs import TokenLogprob
from .params import SamplingParams


def log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def penalize(logits: np.ndarray, params: Seq[SamplingParams], prompts: Seq[list[int]],
             outs: Seq[list[int]]) -> np.ndarray:
    """Repetition penalty over prompt and output tokens (divide positive logits, multiply
    negative ones); frequency (per occurrence) and presence (once) penalties over the output."""
    z = logits.astype(np.float64)
    for i, (p, prompt, out) in enumerate(zip(params, prompts, outs)):
        if p.repetition_penalty != 1.0:
            seen = np.unique(np.asarray(prompt + out, np.int64))
            v = z[i, seen]
            z[i, seen] = np.where(v > 0, v / p.repetition_penalty, v * p.repetition_penalty)
        if out and (p.frequency_penalty or p.presence_penalty):
            counts = np.bincount(np.asarray(out, np.int64), minlength=z.shape[1])[:z.shape[1]]
            z[i] -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0)
    return z


def sample(logits: np.ndarray, params: Seq[SamplingParams], rngs: Seq[np.random.Generator],
           prompts: Seq[list[int]], outs: Seq[list[int]]) -> tuple[list[int], list[TokenLogprob | None]]:
    """One token per row of `logits` [rows, vocab], and its logprob entry when asked."""
    z = penalize(logits, params, prompts, outs)
    n, vocab = z.shape
    greedy = np.array([p.greedy for p in params])
    temp = np.array([1.0 if p.greedy else p.temperature for p in params])[:, None]
    scaled = z / temp
    order = np.argsort(-scaled, axis=1, kind="stable")
    srt = np.take_along_axis(scaled, order, axis=1)
    probs = np.exp(log_softmax(srt))
    keep = np.ones_like(srt, dtype=bool)
    top_k = np.array([p.top_k if p.top_k > 0 else vocab for p in params])[:, None]
    keep &= np.arange(vocab)[None, :] < top_k
    top_p = np.array([p.top_p for p in params])[:, None]
    before = np.cumsum(probs, axis=1) - probs  # mass of the better tokens: keep while it is below top_p
    keep &= before < top_p
    min_p = np.array([p.min_p for p in params])[:, None]
    keep &= probs >= min_p * probs[:, :1]
    keep[:, 0] = True
    kept = np.where(keep, probs, 0.0)
    kept /= kept.sum(axis=1, keepdims=True)
    tokens = []
    for i in range(n):
        if greedy[i]:
            tokens.append(int(order[i, 0]))
        else:
            j = int(np.searchsorted(np.cumsum(kept[i]), rngs[i].random(), side="right"))
            tokens.append(int(order[i, min(j, vocab - 1)]))
    return tokens, logprobs_of(logits, tokens, params)


def logprobs_of(logits: np.ndarray, tokens: Seq[int], params: Seq[SamplingParams]) -> list[TokenLogprob | None]:
    """The model's own log-probabilities (before penalties and temperature) of the chosen
    token and the top k, for the rows that ask."""
    out: list[TokenLogprob | None] = []
    for i, (t, p) in enumerate(zip(tokens, params)):
        if p.logprobs is None:
            out.append(None)
            continue
        lp = log_softmax(logits[i].astype(np.float64))
        top = np.argsort(-lp, kind="stable")[:p.logprobs]
        out.append(TokenLogprob(int(t), float(lp[t]), tuple((int(k), float(lp[k])) for k in top)))
    return out
