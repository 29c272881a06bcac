"""The draft proposer: a second, smaller deployment of the same tokenizer (its own manifest,
weights and pool) runs k steps ahead of each speculating sequence.

A sequence's draft lease records only tokens the target kept: a round feeds the draft the
target's tokens it has not seen (a prefill chunk ending at the sequence's last token, whose
draw is the first proposal) and then k - 1 steps, each fed back on the device; after
verification the lease is extended by the kept proposals alone, so the state the draft wrote
for rejected ones lies past its length and is overwritten next round (its state rolled back
with the target's). A draft draws with the target's keys: at temperature T its proposal is
the draw the target makes where the two models agree, which the verify program keeps."""

from __future__ import annotations

from ..runtime.errors import KernError
from ..runtime.paging import Busy
from .runner import Feed, Runner, Units
from .sequence import SequenceState


class DraftProposer:
    def __init__(self, engine, paging, context: int):
        """`engine`: the draft deployment's engine with its own pool (`paging`); `context`:
        positions its sequences may reach."""
        self.engine, self.paging, self.context = engine, paging, context
        scratch = paging.lease([], paging.page_tokens, cache=False).lease
        paging.extend(scratch, [0] * paging.page_tokens)
        self.runner = Runner(engine, engine.protocol, scratch)
        self.chunk = engine.protocol.max_chunk
        # by the SequenceState itself (a request id may come again once its request ended)
        self._leases: dict[SequenceState, object] = {}  # sequence -> its draft lease
        self._fed: dict[SequenceState, int] = {}  # sequence -> proposals fed back into its draft this round
        self._need: dict[SequenceState, int] = {}  # sequence -> tokens its draft lease holds pages for this round

    def propose(self, seqs: list[SequenceState], ks: list[int], keys: list[list[int]]) -> list[list[int]]:
        k = max(ks, default=0)
        want = [i for i, (s, n) in enumerate(zip(seqs, ks)) if n > 0 and self._ready(s, k)]
        want = want[:self.runner.decode_max]  # a round's draft steps are one decode batch
        out: list[list[int]] = [[] for _ in seqs]
        self._fed = {}
        if not want:
            return out
        # the tokens each draft has not seen, up to the sequence's last one: whole chunks first
        # (their draws unused), then one run whose last rows draw each first proposal
        pending = {i: seqs[i].tokens[len(self._leases[seqs[i]].tokens):] for i in want}
        while any(len(p) > self.chunk for p in pending.values()):
            part = [i for i in want if len(pending[i]) > self.chunk]
            self.runner.run([self._feed(seqs[i], pending[i][:self.chunk], 0.0, 0) for i in part], logits=False)
            for i in part:
                self._write(seqs[i], pending[i][:self.chunk])
                pending[i] = pending[i][self.chunk:]
        first, _ = self.runner.run([self._feed(seqs[i], pending[i], _temperature(seqs[i]), keys[i][0])
                                    for i in want], logits=False)
        for j, i in enumerate(want):
            self._write(seqs[i], pending[i])
            out[i] = [int(first[j])]
        if k > 1:  # k - 1 steps more, each draw fed back on the device
            key = lambda i, j: keys[i][j] if j < len(keys[i]) else 0  # noqa: E731
            at = [self._feed(seqs[i], out[i], _temperature(seqs[i]), key(i, 1)) for i in want]
            later = [[key(i, j + 1) for i in want] for j in range(1, k - 1)]
            made = self.runner.run_ahead(at, k - 1, later if any(map(any, later)) else None)
            for j, i in enumerate(want):
                out[i] += [int(t[j]) for t in made][:ks[i] - 1]
        for i in want:
            self._fed[seqs[i]] = len(out[i]) - 1
        return out

    def settle(self, seqs: list[SequenceState], kept: list[int]) -> None:
        """Record the kept proposals the draft was fed: their state is that of the target's
        tokens now; the rest lies past the lease's length and is overwritten."""
        for s, a in zip(seqs, kept):
            fed = self._fed.get(s)
            if fed:
                lease = self._leases[s]
                n = len(lease.tokens)
                self.paging.extend(lease, s.tokens[n:n + min(a, fed)])
        self._fed = {}

    def release(self, live) -> None:
        """Leases of sequences that ended or left become checkpoints: a later turn's draft
        starts from its prefix."""
        for s in [x for x in self._leases if x not in live]:
            self._need.pop(s, None)
            self.paging.pool.checkpoint(self._leases.pop(s))

    def _ready(self, s: SequenceState, k: int) -> bool:
        """s's draft lease holds its tokens' pages and k more (leased on first use, from the
        draft's prefix cache); False where the draft's pool or context cannot hold them now."""
        need = len(s.tokens) + k
        if need > self.context:
            return False
        lease = self._leases.get(s)
        try:
            if lease is None:
                grant = self.paging.try_lease(s.tokens[:-1], need)
                if grant is None:
                    return False
                lease = self._leases[s] = grant.lease
            self.paging.extend(lease, [], ahead=need - len(lease.tokens))
            self._need[s] = need
        except Busy:
            return False
        return True

    def _feed(self, s: SequenceState, tokens: list[int], temperature: float, key: int) -> Feed:
        lease = self._leases[s]
        return Feed(tokens, len(lease.tokens), Units.of(lease), temperature, key)

    def _write(self, s: SequenceState, tokens: list[int]) -> None:
        """Record tokens the draft was fed, keeping the pages bound for the rest of the round
        (an extend without them gives those pages back)."""
        lease = self._leases[s]
        self.paging.extend(lease, tokens, ahead=max(0, self._need[s] - len(lease.tokens) - len(tokens)))


def _temperature(s: SequenceState) -> float:
    return s.params.device_temperature


def check_pair(target: tuple[int, int], draft: tuple[int, int], target_tokenizer: bytes | None,
               draft_tokenizer: bytes | None) -> None:
    """A draft speaks the target's tokens: the same token range (each's token input domain)
    and, where both checkpoints ship one, the same tokenizer.json bytes."""
    if target != draft:
        raise KernError(f"the draft's tokens range over {list(draft)}, the target's over {list(target)}: a draft "
                        "must share the target's vocabulary")
    if target_tokenizer is not None and draft_tokenizer is not None and target_tokenizer != draft_tokenizer:
        raise KernError("the draft's tokenizer.json differs from the target's: a draft must share its tokenizer")
