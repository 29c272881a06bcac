"""The scheduler: which waiting requests to admit, which rows each running sequence gets this
step, whom to preempt, and how many decode steps a batch runs with one host wait. The choices
are pure functions over small views, tested without a device; Scheduler applies them to the
loop's sequences and the pool."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .sequence import SequenceState


@dataclass(frozen=True, slots=True)
class Running:
    id: str
    pending: int  # tokens to feed before its next token (1: a decode row)
    prompt: bool = False  # its next row is a prompt token of a deployment whose roles differ: a prefill row
    written: int = 0  # tokens already in its state (its next row's position)
    prompt_len: int = 0  # its prompt's tokens (the keys a chunk's prompt rows attend over: keys_of)


@dataclass(frozen=True, slots=True)
class Row:
    id: str
    tokens: int  # fed this step; a decode row is 1


def admissions(waiting: int, running: int, max_seqs: int) -> int:
    """How many waiting requests to try to admit, in arrival order: up to max_seqs running.
    The loop asks the pool for each in turn and stops at the first it refuses (no overtaking:
    a large request at the head is not starved by small ones behind it)."""
    return max(0, min(waiting, max_seqs - running))


def keys_of(r: Running, n: int) -> int:
    """The prompt keys a chunk of n rows of r attends over (Batch.keys): positions up to its last
    prompt row, if it has one."""
    return min(r.written + n, r.prompt_len) if r.written < r.prompt_len else 0


def schedule(running: Sequence[Running], budget: int, chunk_max: int, decode_groups: int,
             mixed_groups: int, keys: int | None = None) -> list[Row]:
    """This step's rows: every decoding sequence's one token first (decode latency does not wait
    on prefill), then prefill chunks in admission order while the token budget lasts. At most
    `decode_groups` sequences in a step of decode rows only, `mixed_groups` in a step with
    prefill chunks; chunks at most `chunk_max` tokens; where the deployment counts the prompt
    keys a step attends over (`keys`, Limits.keys), chunks within that too: one that does not
    fit is cut to fit, or waits for a later step (a chunk alone always fits: the context is at
    most `keys`)."""
    rows: list[Row] = []
    left, keys_left = budget, keys
    for r in running:
        if r.pending == 1 and not r.prompt and left > 0 and len(rows) < decode_groups:
            if keys_left is not None:  # a one-token row not flagged `prompt` may still be a prompt token
                if keys_of(r, 1) > keys_left:
                    continue
                keys_left -= keys_of(r, 1)
            rows.append(Row(r.id, 1))
            left -= 1
    for r in running:
        if (r.pending > 1 or r.prompt) and left > 0 and len(rows) < mixed_groups:
            n = min(r.pending, left, chunk_max)
            if keys_left is not None and keys_of(r, n) > keys_left:
                n = keys_left - r.written  # its last prompt row the last key that fits
                if n < 1:
                    continue
            if keys_left is not None:
                keys_left -= keys_of(r, n)
            rows.append(Row(r.id, n))
            left -= n
    return rows


def _upto_snapshot(s: SequenceState, n: int) -> int:
    """A chunk of n tokens cut to end where s takes its next snapshot, if it would pass it."""
    at = s.snapshots[0] if s.snapshots else 0
    return at - s.written if s.written < at < s.written + n else n


def victim(running: Sequence[Running]) -> str:
    """The request to preempt when the budget cannot grow the running ones: the youngest
    (admitted last), whose checkpoint is smallest and whose wait is fairest."""
    return running[-1].id


@dataclass(frozen=True, slots=True)
class StepPlan:
    """This step: each sequence with the tokens it is fed, and how many decode steps the rows
    run with one host wait (ahead > 1: every row is a decode row, its token fed back on the
    device, each step's tokens streamed as they land)."""

    rows: list[tuple[SequenceState, int]]
    ahead: int = 1


class Scheduler:
    """The waiting and running sequences and every choice about them: admission (in arrival
    order, by pool lease), this step's rows under the token budget, preemption where the budget
    cannot grow them, and how far a batch of decode rows runs ahead."""

    def __init__(self, paging, limits, decode_groups: int, mixed_groups: int, chunk_max: int, ahead_rows: int):
        """`ahead_rows`: the most rows one run-ahead takes (one decode program's graphs; 0: the
        device runs no steps without the host)."""
        self.paging, self.limits = paging, limits
        self.decode_groups, self.mixed_groups, self.chunk_max = decode_groups, mixed_groups, chunk_max
        self.ahead_rows = ahead_rows
        self.recurrent = any(not k.paged for k in paging.pool.layout.kinds)  # per-sequence states
        self.waiting: deque[SequenceState] = deque()
        self.running: list[SequenceState] = []
        self.hold = False  # admit nothing until a request ends: no preemption ping-pong
        self.prompt_tokens = self.cached_tokens = 0

    def next(self, host_draws: Callable[[SequenceState], bool]) -> StepPlan:
        """Admit what fits, then plan the step. `host_draws(s)`: whether the host reads s's
        logits (then it cannot run ahead: its token is drawn on the host)."""
        self.admit()
        if not self.running:
            return StepPlan([])
        k = self._ahead(host_draws)
        if k > 1:
            return StepPlan([(s, 1) for s in self.running], k)
        rows = schedule([Running(s.id, s.pending, s.roles and s.written < len(s.prompt), s.written, len(s.prompt))
                         for s in self.running], self.limits.budget, self.chunk_max,
                        self.decode_groups, self.mixed_groups, self.limits.keys)
        by_id = {s.id: s for s in self.running}
        return StepPlan(self._grow([(by_id[r.id], _upto_snapshot(by_id[r.id], r.tokens)) for r in rows]))

    def admit(self) -> None:
        if self.hold and self.running:
            return
        for _ in range(admissions(len(self.waiting), len(self.running), self.limits.max_seqs)):
            s = self.waiting[0]
            grant = self.paging.try_lease(s.keys(0, len(s.prompt) + len(s.out)), self._promise(s))
            if grant is None:
                return  # the pool says wait: the head keeps its place
            self.waiting.popleft()
            s.lease, s.written = grant.lease, grant.cached
            s.snapshots = self._snapshots(s, grant.cached)
            if not s.admitted:
                s.admitted, s.cached = True, grant.cached
                self.prompt_tokens += len(s.prompt)
                self.cached_tokens += grant.cached
            self.running.append(s)

    def _snapshots(self, s: SequenceState, cached: int) -> list[int]:
        """The lengths at which s's prefill snapshots its per-sequence state. A recurrence
        resumes only from a checkpoint of exactly its length, so:
        - a prompt that shares more with the cache than a whole checkpoint gives (the system
          prompt of an earlier request, which went on past it) snapshots where the sharing
          ends: the next prompt that shares it starts there;
        - where decode runs ahead, the prompt's end: a request that stops inside a run is not
          cached at its end (its slot ran past it), and its next turn starts from here; so too
          where prompt and generated tokens take different forms (SequenceState.roles): the
          next turn recomputes the reply as prompt tokens, from here.
        None shorter than a page (cheaper to recompute than a slot is to copy and hold); none
        for paged states alone (a prefix of any length is usable)."""
        if not self.recurrent:
            return []
        at = {self.paging.pool.shared(s.keys(0, len(s.prompt) + len(s.out)))}
        if (self.limits.run_ahead > 1 or s.roles) and not s.out:
            at.add(len(s.prompt))
        return sorted(n for n in at if n > cached and n >= self.paging.page_tokens)

    def preempt(self, s: SequenceState) -> None:
        """Give a running sequence's memory back, keeping its tokens so far as a prefix
        checkpoint; it waits at the head of the queue and resumes from that checkpoint."""
        self.paging.pool.checkpoint(s.lease)
        s.lease, s.written = None, 0
        self.running.remove(s)
        self.waiting.appendleft(s)

    def remove(self, s: SequenceState) -> None:
        """A sequence that ended (its lease already handed back): admission may resume."""
        self.hold = False
        if s in self.running:
            self.running.remove(s)
        elif s in self.waiting:
            self.waiting.remove(s)

    def _promise(self, s: SequenceState) -> int:
        """Tokens a lease is promised at admission: all it may reach, or its tokens so far and
        the headroom."""
        h = self.limits.headroom
        return s.reach if h is None else min(s.reach, len(s.tokens) + h)

    def _grow(self, rows: list[tuple[SequenceState, int]]) -> list[tuple[SequenceState, int]]:
        """Bind the pages this step's rows write, before anything is recorded; where the budget
        has none, preempt the youngest running sequence (it resumes from its checkpoint) until
        it does. The rows of the sequences still running."""
        pt, state = self.paging.page_tokens, self.paging.state
        for s, n in rows:
            if s.lease is None or s.written + n <= len(s.lease.page_table(state)) * pt:
                continue  # preempted, or its pages are bound already (a decode row needs one in pt steps)
            while s in self.running and not self.paging.try_grow(s.lease, n):
                by_id = {x.id: x for x in self.running}
                self.preempt(by_id[victim([Running(x.id, x.pending) for x in self.running])])
                self.hold = True
        return [(s, n) for s, n in rows if s in self.running]

    def _ahead(self, host_draws: Callable[[SequenceState], bool]) -> int:
        """Decode steps the running batch takes with one host wait: the run-ahead limit where
        every running sequence decodes with its token drawn on the device, they fit one decode
        program, nobody waits who could be admitted at the next step, some row has that many
        tokens left (a row that ends sooner wastes the rest of its run), no row would step past
        the context, and the budget binds the pages; else 1."""
        k = self.limits.run_ahead
        run = self.running
        if k < 2 or len(run) > self.ahead_rows:
            return 1
        if self.waiting and not self.hold and len(run) < self.limits.max_seqs:
            return 1
        if not all(s.out and s.pending == 1 and not host_draws(s) for s in run):
            return 1
        if max(s.left for s in run) < k:
            return 1
        if any(s.written + k > self.limits.context for s in run):
            return 1  # a run may not step a row past the context, even where the row ends first
        return k if all(self.paging.try_grow(s.lease, k) for s in run) else 1
