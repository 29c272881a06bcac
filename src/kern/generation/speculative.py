"""Speculative rounds: a proposer guesses the next tokens of each decoding sequence, and one run
of the manifest's verify program scores a sequence's last token and its k proposed tokens as
k + 1 rows, draws the target's token at every row (the argmax, or the draw keyed by the
request and the token's index) and writes how many proposed tokens each sequence keeps (the
prefix equal to the target's tokens). The host waits once a round and appends the kept tokens
and the target's token after them: exactly the tokens plain decoding gives, since a verify row
computes what a decode row computes (the kernels reduce a row alone) and draws with the same key.

The state written for rejected rows is never committed: the lease records only kept tokens,
and the pages past a sequence's length are overwritten by its next rows."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from ..errors import KernError
from .keys import draw_key
from .runner import Feed, Units

if TYPE_CHECKING:
    from .outputs import Delta
    from .scheduler import StepPlan
    from .sequence import SequenceState

# Tokens a round proposes at most per sequence by default (`--speculate ngram` = ngram:8).
DEFAULT_K = 8
# Prompt lookup: the longest suffix of a sequence matched against its earlier tokens, tried from
# NGRAM_MAX tokens down to NGRAM_MIN (a one-token match proposes from any repeated token: too
# often wrong on text that does not repeat itself, and each wrong row is paid for).
NGRAM_MAX, NGRAM_MIN = 4, 2
# How much a sequence proposes follows how its rounds went (each wrong row is paid for; on the
# cpu a verify row costs about a fifth of a decode step): after a round that kept every proposed
# token its bound doubles (up to K), after one that kept a of them it is a + 1, and after one
# that kept nothing the sequence also decodes BACKOFF plain steps before it proposes again,
# doubling while rounds keep failing (up to BACKOFF_MAX). Counted in steps, never in time: the
# tokens do not depend on it anyway. (bench/speculative.py's workloads chose these.)
BACKOFF, BACKOFF_MAX = 1, 16


class SpeculateError(KernError, ValueError):
    """A --speculate value or a deployment that cannot speculate; names which."""


@dataclass(frozen=True, slots=True)
class Speculate:
    """What `--speculate` asked for: `ngram` or `draft` (with the draft's folder), k tokens a round."""

    kind: str
    k: int = DEFAULT_K
    draft: Path | None = None

    @classmethod
    def parse(cls, text: str) -> "Speculate":
        """`ngram`, `ngram:K`, `draft:DIR` or `draft:DIR:K` (K a whole number >= 1)."""
        kind, _, rest = text.partition(":")
        k = DEFAULT_K
        if kind == "ngram":
            if rest:
                k = _whole(rest, text)
            return cls("ngram", k)
        if kind == "draft":
            folder, sep, tail = rest.rpartition(":")
            if sep and tail.isdigit():
                k, rest = _whole(tail, text), folder
            if not rest:
                raise SpeculateError(f"--speculate {text!r}: draft needs the draft model's folder (draft:DIR[:K])")
            return cls("draft", k, Path(rest))
        raise SpeculateError(f"--speculate {text!r}: expected ngram[:K] or draft:DIR[:K]")

    def __str__(self) -> str:
        return f"{self.kind}{':' + str(self.draft) if self.draft else ''}:{self.k}"


def _whole(s: str, text: str) -> int:
    if not s.isdigit() or int(s) < 1:
        raise SpeculateError(f"--speculate {text!r}: K must be a whole number >= 1, got {s!r}")
    return int(s)


def ngram_propose(tokens: list[int], k: int, longest: int = NGRAM_MAX, shortest: int = NGRAM_MIN) -> list[int]:
    """Prompt lookup: the k tokens that followed the most recent earlier occurrence of the
    sequence's longest matching suffix (`longest` tokens down to `shortest`); [] when none
    occurs. Only what the sequence itself holds: no model, no state."""
    n_all = len(tokens)
    if k < 1 or n_all < shortest + 1:
        return []
    arr = np.asarray(tokens, np.int64)
    for n in range(min(longest, n_all - 1), shortest - 1, -1):
        suffix = arr[n_all - n:]
        # starts i < n_all - n of earlier windows equal to the suffix, the latest first
        starts = np.flatnonzero(arr[:n_all - n] == suffix[0])
        for i in starts[::-1]:
            if i + n <= n_all - 1 and np.array_equal(arr[i:i + n], suffix):
                out = arr[i + n:i + n + k]
                if out.size:
                    return out.tolist()
    return []


def round_k(sequences: int, k: int, rows: int) -> int:
    """Tokens each sequence may propose this round: a round steps at most `rows` rows (the
    decode batch bound), so a full batch proposes nothing and runs exactly as plain decoding
    would, and a lone stream proposes up to k."""
    return max(0, min(k, rows // max(1, sequences) - 1))


class Proposer(Protocol):
    """Where a round's proposals come from: n-gram lookup, or a draft model."""

    def propose(self, seqs: list[SequenceState], ks: list[int], keys: list[list[int]]) -> list[list[int]]:
        """Up to ks[i] tokens to follow seqs[i]'s tokens (keys[i][j]: the draw key of the j-th)."""

    def settle(self, seqs: list[SequenceState], kept: list[int]) -> None:
        """The round kept kept[i] of seqs[i]'s proposed tokens."""

    def release(self, live: set[SequenceState]) -> None:
        """Sequences not in `live` (the running ones) have ended or left: what they held goes back."""


class NgramProposer:
    def propose(self, seqs, ks, keys):
        return [ngram_propose(s.tokens, k) for s, k in zip(seqs, ks)]

    def settle(self, seqs, kept):
        pass

    def release(self, live):
        pass


@dataclass
class SpecStats:
    """Counters since start: rounds (a sequence's proposal verified), tokens proposed and kept,
    tokens those rounds made, and verify steps (one runs the rounds of many sequences)."""

    rounds: int = 0
    proposed: int = 0
    accepted: int = 0
    tokens: int = 0
    steps: int = 0

    @property
    def acceptance(self) -> float:
        """Proposed tokens kept, of those proposed."""
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def tokens_per_round(self) -> float:
        """Tokens a sequence's round makes, on average (plain decoding: 1)."""
        return self.tokens / self.rounds if self.rounds else 0.0


SPEC_FIELDS = ("rounds", "proposed", "accepted", "tokens", "steps")


@dataclass
class Speculator:
    """Runs a loop's decode steps as rounds where its sequences have proposals."""

    spec: Speculate
    proposer: Proposer
    stats: SpecStats = field(default_factory=SpecStats)
    # sequence id -> [its proposal bound, plain steps before it proposes again, the next backoff]
    _pace: dict[str, list[int]] = field(default_factory=dict)

    def round(self, loop, plan: StepPlan, emit: Callable[[list[Delta]], None] | None) -> list[Delta] | None:
        """This step as a round, or None where it is better run plainly (prefill rows in it,
        a host draw, a full batch, or nothing proposed)."""
        rows = plan.rows
        if not rows or any(n != 1 or s.pending != 1 or not s.out or loop._host_between(s) for s, n in rows):
            return None
        verify = loop.protocol.verify
        seqs = [s for s, _ in rows]
        self.proposer.release(set(loop.running))
        self._pace = {i: w for i, w in self._pace.items() if i in {s.id for s in loop.running}}
        k = round_k(len(seqs), self.spec.k, min(loop.runner.decode_max, verify.rows_max))
        if k == 0 or len(seqs) > verify.groups_max:
            return None
        ks = [self._k(s, k, loop.context) for s in seqs]
        keys = [[_key(s, j) for j in range(kk + 1)] for s, kk in zip(seqs, ks)]
        # a proposal's j-th token stands where the target draws with the row j - 1's key
        props = self.proposer.propose(seqs, ks, [kk[:-1] for kk in keys]) if any(ks) else [[] for _ in seqs]
        props = [p[:kk] for p, kk in zip(props, ks)]
        props = [p if not p or loop.paging.try_grow(s.lease, len(p) + 1) else [] for s, p in zip(seqs, props)]
        if not any(props):
            self.proposer.settle(seqs, [0] * len(seqs))
            return None
        feeds = []
        for s, p in zip(seqs, props):
            loop.paging.extend(s.lease, [s.key(s.out[-1])], ahead=len(p))
            t = s.params.device_temperature
            feeds.append(Feed([s.out[-1]] + p, s.written, Units.of(s.lease), t, prompt=len(s.prompt)))
            s.written += 1
        tokens, accepted = loop.runner.verify(feeds, [kk[:len(p) + 1] for kk, p in zip(keys, props)])
        out, at = [], 0
        kept = [int(a) for a in accepted]
        for s, p, a in zip(seqs, props, kept):
            new = [int(t) for t in tokens[at:at + a + 1]]
            at += len(p) + 1
            self._learn(s, len(p), a)
            used, text, finish = loop._append(s, new, [])
            committed = p[:min(a, used - 1)]  # the rows whose state a plain decode would hold now
            loop.paging.extend(s.lease, [s.key(t) for t in committed])
            s.written += len(committed)
            out.append(loop._close(s, new[:used], text, [], finish))
        self.proposer.settle(seqs, kept)
        st = self.stats
        st.steps += 1
        st.rounds += sum(1 for p in props if p)
        st.proposed += sum(len(p) for p in props)
        st.accepted += sum(a for a, p in zip(kept, props) if p)
        st.tokens += sum(len(d.token_ids) for d, p in zip(out, props) if p)
        if emit is not None:
            emit(out)
            return []
        return out

    def warm_up(self, loop) -> int:
        """Run a lone stream's rounds of every width (2 to k + 1 rows) once on the scratch page,
        so that where the verify program is a CUDA graph (one a width) its rounds replay graphs
        and never capture one; the loop's warm_up calls it. Returns the rounds run."""
        verify = loop.protocol.verify
        if verify is None:
            return 0
        k = round_k(1, self.spec.k, min(loop.runner.decode_max, verify.rows_max))
        todo = [n for n in range(2, k + 2) if ("verify", n) not in loop._warm]
        for n in todo:
            scratch = loop.runner.scratch_feed(0, n)
            loop.runner.verify([replace(scratch, tokens=[0] * n)], [[0] * n])
            loop._warm.add(("verify", n))
        return len(todo)

    def _k(self, s: SequenceState, k: int, context: int) -> int:
        """s's proposal bound this round: k, less while its rounds go badly (or 0 while it backs
        off), never past its max_tokens (a round makes at most k + 1 tokens) or the context."""
        pace = self._pace.setdefault(s.id, [self.spec.k, 0, BACKOFF])
        if pace[1] > 0:
            pace[1] -= 1
            return 0
        return max(0, min(k, pace[0], s.left - 1, context - s.written - 1))

    def _learn(self, s: SequenceState, proposed: int, kept: int) -> None:
        if not proposed or s.id not in self._pace:
            return
        pace = self._pace[s.id]
        if kept == proposed:
            pace[0], pace[2] = min(self.spec.k, 2 * max(pace[0], proposed)), BACKOFF
        elif kept:
            pace[0], pace[2] = kept + 1, BACKOFF
        else:
            pace[0], pace[1], pace[2] = 1, pace[2], min(2 * pace[2], BACKOFF_MAX)


def _key(s: SequenceState, j: int) -> int:
    """The draw key of s's token j places past its last one (0 where it draws the argmax)."""
    return 0 if s.params.greedy else draw_key(s.seed, len(s.out) + j)
