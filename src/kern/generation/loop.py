"""The host loop: requests in, Deltas out, one step() at a time.

    step = schedule (admit by pool lease, pick rows) -> run the programs -> postprocess
           (sample, append, stop, stream text, checkpoint finished leases)

Single-threaded: the server drives it from its engine process (serve/engine_process.py)."""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from ..runtime.errors import BoundsError, KernError
from ..runtime.paging import Paging
from .detok import TextStream
from .limits import Limits
from .outputs import Delta, LoopStats, TokenLogprob
from .params import SamplingParams
from .runner import Feed, Runner
from .sampling import logprobs_of, sample
from .scheduler import Row, Running, admissions, schedule, victim
from .sequence import Sequence

if TYPE_CHECKING:
    from ..runtime.stepping import StepEngine
    from ..tokenizer import Tokenizer


class Loop:
    def __init__(self, engine: StepEngine, paging: Paging, tokenizer: Callable[[], Tokenizer], eos: set[int],
                 limits: Limits, model_name: str):
        """`tokenizer`: a callable giving the Tokenizer, called on first use (a checkpoint without
        one: token ids only, no text)."""
        self.engine, self.paging = engine, paging
        self._load_tokenizer, self._tokenizer, self._loaded = tokenizer, None, False
        self.protocol = engine.protocol
        self.state = paging.state
        self.eos = eos
        self.limits = limits
        self.context = limits.context
        self.model_name = model_name
        self.runner = Runner(engine, self.protocol, self._scratch(), limits.max_seqs)
        self._token_domain = engine.domain(self.runner.ragged.inputs["token"])
        self._warm: set[tuple[int, int, int]] = set()
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._ids: set[str] = set()
        self._aborted: list[Delta] = []
        self._steps = self._prompt_tokens = self._cached_tokens = 0
        self._hold = False

    @property
    def tokenizer(self):
        if not self._loaded:
            self._loaded = True
            try:
                self._tokenizer = self._load_tokenizer()
            except KernError:  # a checkpoint without tokenizer.json: token ids only
                self._tokenizer = None
        return self._tokenizer

    @tokenizer.setter
    def tokenizer(self, tok) -> None:
        self._tokenizer, self._loaded = tok, True

    def _scratch(self) -> int:
        """A page that padding rows of a captured decode batch write to; no sequence reads it."""
        lease = self.paging.lease([], self.paging.page_tokens, cache=False).lease
        self.paging.extend(lease, [0] * self.paging.page_tokens)
        self._scratch_lease = lease
        return lease.page_table(self.state)[0]

    def warm_up(self, sizes: list[int] | None = None, reach: int | None = None, progress: bool = True) -> int:
        """Run each decode batch size (default: every captured size) at each reach bucket up
        to `reach` (default: the context) once on the scratch page, and the run-ahead graph of
        one sequence, so that requests replay graphs and never capture one. A no-op where the
        device captures none. Returns the steps run."""
        if not self.runner.graphs:
            return 0
        reaches = self.runner.reach_buckets(reach or self.context)
        k = self.limits.run_ahead
        todo = [(n, r, 1) for n in (sizes or self.runner.sizes) for r in reaches]
        todo += [(1, r, k) for r in reaches if k > 1 and r >= k and (sizes is None or 1 in sizes)]
        todo = [t for t in todo if t not in self._warm]
        if progress and todo:
            from tqdm import tqdm

            todo = tqdm(todo, desc="[kern] capturing decode graphs", unit="graph", file=sys.stderr)
        for n, r, steps in todo:
            if steps == 1:
                self.runner.run([self.runner.scratch_feed(r - 1)] * n, logits=False)
            else:
                self.runner.run_ahead(self.runner.scratch_feed(r - steps), steps)
            self._warm.add((n, r, steps))
        return len(todo)

    # ---- requests ------------------------------------------------------------------------
    def add(self, request_id: str, prompt_ids: list[int], params: SamplingParams) -> None:
        params.check()
        if request_id in self._ids:
            raise BoundsError(f"request id {request_id!r} is already in the loop")
        if not prompt_ids:
            raise BoundsError(f"request {request_id!r}: empty prompt")
        lo, hi = self._token_domain
        if not all(isinstance(t, int) and lo <= t < hi for t in prompt_ids):
            raise BoundsError(f"request {request_id!r}: prompt token ids must be integers in [{lo}, {hi})")
        if len(prompt_ids) + 1 > self.context:
            raise BoundsError(f"request {request_id!r}: a prompt of {len(prompt_ids)} tokens does not fit the "
                              f"context of {self.context} positions (the prompt plus one generated token)")
        max_tokens = min(params.max_tokens, self.context - len(prompt_ids))
        if not self.paging.fits(len(prompt_ids) + max_tokens):
            raise BoundsError(f"request {request_id!r}: {len(prompt_ids) + max_tokens} tokens never fit the state "
                              "budget: raise --memory or shorten the request")
        seed = params.seed if params.seed is not None else _seed_of(request_id)
        self.waiting.append(Sequence(request_id, list(prompt_ids), params, max_tokens,
                                     TextStream(self.tokenizer, params.stop),
                                     np.random.Generator(np.random.PCG64(seed)), seed))
        self._ids.add(request_id)

    def abort(self, request_id: str) -> None:
        """Free the request's lease now; its Delta (finish "abort") comes with the next step()."""
        for s in [*self.waiting, *self.running]:
            if s.id == request_id:
                self._end(s, "abort")
                self._aborted.append(self._delta(s, [], "", []))
                return

    def preempt(self, request_id: str) -> None:
        """Give a running request's memory back, keeping its tokens so far as a prefix
        checkpoint; it waits at the head of the queue and resumes from that checkpoint."""
        s = next((s for s in self.running if s.id == request_id), None)
        if s is None:
            return
        self.paging.pool.checkpoint(s.lease)
        s.lease, s.written = None, 0
        self.running.remove(s)
        self.waiting.appendleft(s)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self._aborted)

    def stats(self) -> LoopStats:
        u = self.paging.pool.usage()[self.state]
        return LoopStats(len(self.waiting), len(self.running), self._steps, self._prompt_tokens,
                         self._cached_tokens, u["held"], u["mapped"])

    # ---- the step ------------------------------------------------------------------------
    def step(self) -> list[Delta]:
        deltas, self._aborted = self._aborted, []
        self._admit()
        if not self.running:
            return deltas
        self._steps += 1
        alone = self._alone()
        if alone is not None and self.paging.try_grow(alone.lease, self.limits.run_ahead):
            return deltas + self._run_ahead(alone)
        rows = schedule([Running(s.id, s.pending) for s in self.running], self.limits.budget,
                        self.protocol.max_chunk, self.runner.decode_groups, self.runner.mixed_groups)
        rows = self._grow(rows)
        by_id = {s.id: s for s in self.running}
        seqs, feeds = [], []
        for r in rows:
            s = by_id[r.id]
            part = s.span(s.written, r.tokens)
            self.paging.extend(s.lease, part)
            s.written += r.tokens
            t = s.params.temperature if s.pending == 0 and not self._host_draws(s) and not s.params.greedy else 0.0
            feeds.append(Feed(part, s.written - r.tokens, s.lease.page_table(self.state), t,
                              draw_key(s.seed, len(s.out)) if t else 0))
            seqs.append(s)
        if not feeds:
            return deltas
        emitting = [i for i, s in enumerate(seqs) if s.pending == 0]
        need_logits = any(self._host_draws(seqs[i]) for i in emitting)
        tokens, logits = self.runner.run(feeds, need_logits)
        return deltas + self._postprocess([seqs[i] for i in emitting], tokens[emitting],
                                          None if logits is None else logits[emitting])

    def _host_draws(self, s: Sequence) -> bool:
        """Whether the host reads this row's logits (to draw, penalise, truncate or report
        logprobs); otherwise the device's token is the row's token."""
        return not s.params.device_samples if self.runner.samples else s.params.needs_logits

    def _grow(self, rows: list[Row]) -> list[Row]:
        """Bind the pages this step's rows write, before anything is recorded; where the budget
        has none, preempt the youngest running request (it resumes from its checkpoint) until
        it does. The rows of the requests still running."""
        by_id = {s.id: s for s in self.running}
        for r in rows:
            s = by_id[r.id]
            while s in self.running and not self.paging.try_grow(s.lease, r.tokens):
                self.preempt(victim([Running(x.id, x.pending) for x in self.running]))
                self._hold = True  # admit nothing more until a request ends: no preemption ping-pong
        alive = {s.id for s in self.running}
        return [r for r in rows if r.id in alive]

    def _admit(self) -> None:
        if self._hold and self.running:
            return
        for _ in range(admissions(len(self.waiting), len(self.running), self.limits.max_seqs)):
            s = self.waiting[0]
            grant = self.paging.try_lease(s.tokens, self._promise(s))
            if grant is None:
                return  # the pool says wait: the head keeps its place
            self.waiting.popleft()
            s.lease, s.written = grant.lease, grant.cached
            if not s.admitted:
                s.admitted, s.cached = True, grant.cached
                self._prompt_tokens += len(s.prompt)
                self._cached_tokens += grant.cached
            self.running.append(s)

    def _promise(self, s: Sequence) -> int:
        """Tokens a lease is promised at admission: all it may reach, or its tokens so far and
        the headroom."""
        worst = len(s.prompt) + s.max_tokens
        h = self.limits.headroom
        return worst if h is None else min(worst, len(s.tokens) + h)

    def _alone(self) -> Sequence | None:
        """The one greedy decoding sequence, when nothing else runs or waits: it runs ahead
        (whole runs only, one graph per reach: the tail goes step by step)."""
        if self.limits.run_ahead < 2 or len(self.running) != 1 or self.waiting:
            return None
        s = self.running[0]
        decoding = s.out and s.pending == 1 and s.params.greedy and not s.params.needs_logits
        return s if decoding and s.max_tokens - len(s.out) >= self.limits.run_ahead else None

    def _run_ahead(self, s: Sequence) -> list[Delta]:
        k = self.limits.run_ahead
        self.paging.extend(s.lease, [s.out[-1]], ahead=k - 1)
        made = self.runner.run_ahead(Feed([s.out[-1]], s.written, s.lease.page_table(self.state)), k)
        s.written += 1
        used, text, finish = self._append(s, made, [])
        written = made[:used - 1]  # the state of every kept token but the last is on the device
        self.paging.extend(s.lease, written, ahead=k - 1 - len(written))  # the rest goes back
        s.written += len(written)
        return [self._close(s, made[:used], text, [], finish)]

    # ---- postprocess ---------------------------------------------------------------------
    def _postprocess(self, seqs: list[Sequence], tokens: np.ndarray, logits: np.ndarray | None) -> list[Delta]:
        chosen = [int(t) for t in tokens]
        lps: list[TokenLogprob | None] = [None] * len(seqs)
        if logits is not None:
            pick = [i for i, s in enumerate(seqs) if self._host_draws(s)]
            sub = logits[pick]
            if any(not seqs[i].params.greedy or seqs[i].params.penalized for i in pick):
                toks, lp = sample(sub, [seqs[i].params for i in pick], [seqs[i].rng for i in pick],
                                  [seqs[i].prompt for i in pick], [seqs[i].out for i in pick])
            else:
                toks = [chosen[i] for i in pick]
                lp = logprobs_of(sub, toks, [seqs[i].params for i in pick])
            for j, i in enumerate(pick):
                chosen[i], lps[i] = toks[j], lp[j]
        out = []
        for s, t, lp in zip(seqs, chosen, lps):
            _, text, finish = self._append(s, [t], [])
            out.append(self._close(s, [t], text, [lp] if lp is not None else [], finish))
        return out

    def _append(self, s: Sequence, new: list[int], lps: list[TokenLogprob]) -> tuple[int, str, str | None]:
        """Append tokens until one ends the request: (tokens used, new text, finish reason)."""
        text = ""
        for i, t in enumerate(new):
            s.out.append(t)
            special = (t in self.eos and not s.params.ignore_eos) or t in s.params.stop_token_ids
            if not special:
                text += s.text.push(t)
            if s.text.stopped or special:
                return i + 1, text, "stop"
            if len(s.out) >= s.max_tokens:
                return i + 1, text, "length"
        return len(new), text, None

    def _close(self, s: Sequence, new: list[int], text: str, lps: list[TokenLogprob], finish: str | None) -> Delta:
        if finish:
            text += s.text.flush()
            self._end(s, finish)
        return self._delta(s, new, text, lps)

    def _end(self, s: Sequence, finish: str) -> None:
        s.finish = finish
        self._hold = False
        if s.lease is not None:
            if finish == "abort":
                self.paging.pool.free(s.lease)
            else:  # its pages stay as a cached prefix until evicted
                self.paging.pool.checkpoint(s.lease)
            s.lease = None
        if s in self.running:
            self.running.remove(s)
        elif s in self.waiting:
            self.waiting.remove(s)
        self._ids.discard(s.id)

    @staticmethod
    def _delta(s: Sequence, new: list[int], text: str, lps: list[TokenLogprob]) -> Delta:
        return Delta(s.id, tuple(new), text, tuple(lps), s.finish, len(s.prompt), s.cached, len(s.out))


def draw_key(seed: int, n: int) -> int:
    """The 64-bit key of a request's n-th device draw: its seed and n mixed (splitmix64), so a
    seed reproduces every draw whatever else shares the batch."""
    return _mix64((seed ^ _mix64(n)) & _M64)


_M64 = (1 << 64) - 1


def _mix64(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def _seed_of(request_id: str) -> int:
    """A request without a seed draws from one derived from its id: reproducible, and no two
    requests share a stream by accident of arrival order."""
    import hashlib

    return int.from_bytes(hashlib.sha256(request_id.encode()).digest()[:8], "little")
