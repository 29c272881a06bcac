"""Sampling on the host, vectorized over the rows of a step that read logits: logit bias,
penalties, a grammar's mask, temperature, top_k, top_p, min_p, then one draw per row from a uniform number keyed by that
request's seed and the token's index (keys.HostDraw).
(On the device it needs sampling kernels; until then greedy rows take the device's argmax.)"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from .outputs import TokenLogprob
from .params import SamplingParams


def log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


# Penalized logits stay within +-LIMIT: an infinite logit (or a huge one over a tiny repetition
# penalty) would otherwise make inf - inf = NaN in the softmax; tokens at the limit tie. Divided
# by a temperature >= GREEDY_BELOW it still fits a float64.
LIMIT = 1e300
# The floor of a reported logprob: JSON has no -inf (OpenAI reports -9999 for the impossible).
LOGPROB_FLOOR = -9999.0


def penalize(logits: np.ndarray, params: Sequence[SamplingParams], prompts: Sequence[list[int]],
             outs: Sequence[list[int]]) -> np.ndarray:
    """Logit bias (added first, as OpenAI's), then the repetition penalty over prompt and
    output tokens (divide positive logits, multiply negative ones); frequency (per occurrence)
    and presence (once) penalties over the output. A NaN logit never wins (as on the device):
    it counts as -inf."""
    z = logits.astype(np.float64)
    if not np.isfinite(z).all():  # in place: a second vocabulary-wide array costs its page faults (~2 ms a row)
        np.nan_to_num(z, copy=False, nan=-np.inf, posinf=LIMIT)
    for i, p in enumerate(params):
        if p.logit_bias:
            ids, bias = zip(*p.logit_bias)
            keep = np.asarray(ids) < z.shape[1]  # a token past the logits' width has no logit to bias
            np.add.at(z[i], np.asarray(ids)[keep], np.asarray(bias, np.float64)[keep])
    with np.errstate(over="ignore"):  # a tiny repetition penalty: the clip below takes the inf
        _penalize_rows(z, params, prompts, outs)
    return np.clip(z, -np.inf, LIMIT, out=z)


def _penalize_rows(z: np.ndarray, params: Sequence[SamplingParams], prompts: Sequence[list[int]],
                   outs: Sequence[list[int]]) -> None:
    for i, (p, prompt, out) in enumerate(zip(params, prompts, outs)):
        if p.repetition_penalty != 1.0:
            seen = np.unique(np.asarray(prompt + out, np.int64))
            v = z[i, seen]
            z[i, seen] = np.where(v > 0, v / p.repetition_penalty, v * p.repetition_penalty)
        if out and (p.frequency_penalty or p.presence_penalty):
            counts = np.bincount(np.asarray(out, np.int64), minlength=z.shape[1])[:z.shape[1]]
            z[i] -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0)


class Uniform(Protocol):
    """Where a row's draw comes from: a number in [0, 1) (keys.HostDraw; a numpy Generator)."""

    def random(self) -> float: ...


# Tokens a sampled row sorts at first; the whole vocabulary only when its draw or its kept set
# reaches past them (a full sort of a 128k vocabulary costs milliseconds a row).
CANDIDATES = 1024


def sample(logits: np.ndarray, params: Sequence[SamplingParams], rngs: Sequence[Uniform],
           prompts: Sequence[list[int]], outs: Sequence[list[int]], allowed: np.ndarray | None = None
           ) -> tuple[list[int], list[TokenLogprob | None]]:
    """One token per row of `logits` [rows, vocab], and its logprob entry when asked.
    `allowed`: bool [rows, vocab], the tokens a row may draw (a grammar's mask; None: all)."""
    z = penalize(logits, params, prompts, outs)
    if allowed is not None:
        mask(z, allowed)
    tokens = [int(np.argmax(z[i])) if p.greedy else _draw(z[i] / p.temperature, p, rngs[i])
              for i, p in enumerate(params)]
    return tokens, logprobs_of(logits, tokens, params)


def mask(z: np.ndarray, allowed: np.ndarray) -> None:
    """Rule out, in place, the tokens a row may not draw. A row whose allowed tokens all sit at
    -inf (NaN logits, say) draws among them evenly rather than a forbidden token."""
    np.putmask(z, ~allowed, -np.inf)  # cheaper than a boolean index over the vocabulary
    dead = ~np.isfinite(z.max(axis=1)) & allowed.any(axis=1)
    if dead.any():
        z[dead] = np.where(allowed[dead], 0.0, -np.inf)


def _draw(scaled: np.ndarray, p: SamplingParams, rng: Uniform) -> int:
    """One draw from the tokens that top_k, top_p and min_p keep, best first in a stable order
    (ties by token id): the token a full sort would give, found among the best CANDIDATES.
    With nothing truncated no order matters: one pass over the vocabulary in id order."""
    vocab = scaled.size
    u = rng.random()
    if p.top_k <= 0 and p.top_p >= 1.0 and p.min_p <= 0.0:
        cum = np.cumsum(np.exp(scaled - scaled.max()))
        # normalized, the last sum is exactly 1 > u: the first sum past u ends a token of mass > 0
        # (u * cum[-1] may round up to cum[-1] and land past the last token that has any)
        return int(np.searchsorted(cum / cum[-1], u, side="right"))
    lse = scaled.max() + np.log(np.exp(scaled - scaled.max()).sum())
    m = min(vocab, max(CANDIDATES, p.top_k))
    while True:
        if m < vocab:
            part = np.argpartition(-scaled, m - 1)[:m]
            order = part[np.lexsort((part, -scaled[part]))]
        else:
            order = np.argsort(-scaled, kind="stable")
        probs = np.exp(scaled[order] - lse)
        keep = np.ones(m, dtype=bool)
        if p.top_k > 0:
            keep &= np.arange(m) < p.top_k
        keep &= (np.cumsum(probs) - probs) < p.top_p  # keep while the better tokens' mass is below top_p
        keep &= probs >= p.min_p * probs[0]
        keep[0] = True
        kept = np.where(keep, probs, 0.0)
        cum = np.cumsum(kept)
        if not keep[-1] or m == vocab:  # the kept set ends among the candidates: normalize over it
            return int(order[min(int(np.searchsorted(cum / cum[-1], u, side="right")), m - 1)])
        m = vocab  # the kept set reaches past the candidates: sort them all


def logprobs_of(logits: np.ndarray, tokens: Sequence[int], params: Sequence[SamplingParams]) -> list[TokenLogprob | None]:
    """The model's own log-probabilities (before penalties and temperature) of the chosen
    token and the top k, for the rows that ask."""
    out: list[TokenLogprob | None] = []
    for i, (t, p) in enumerate(zip(tokens, params)):
        if p.logprobs is None:
            out.append(None)
            continue
        lp = np.fmax(log_softmax(np.nan_to_num(logits[i].astype(np.float64), nan=-np.inf, posinf=LIMIT)),
                        LOGPROB_FLOOR)
        top = np.argsort(-lp, kind="stable")[:p.logprobs]
        out.append(TokenLogprob(int(t), float(lp[t]), tuple((int(k), float(lp[k])) for k in top)))
    return out
