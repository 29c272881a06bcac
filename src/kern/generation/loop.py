"""The host loop: requests in, Deltas out, one step() at a time.

    step = schedule (the Scheduler: admit by pool lease, pick rows, preempt, choose the run-ahead)
           -> run the programs -> postprocess (sample, append, stop, stream text, checkpoint
           finished leases)

A batch of decode rows runs several steps with one host wait when the scheduler says so, each
step's tokens handed to `emit` as they land: the host's part of a step (schedule, inputs,
launch) is paid once a run and its postprocess overlaps the device's next steps.

Single-threaded: the server drives it from its engine process (serve/engine_process.py)."""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from ..errors import BoundsError, KernError
from ..runtime.paging import Paging
from .constraints import Grammars
from .detok import TextStream
from .keys import HostDraw, draw_key, seed_of
from .limits import Limits
from .outputs import Delta, LoopStats, TokenLogprob
from .params import SamplingParams, context_room
from .runner import Feed, Runner, Units
from .sampling import logprobs_of, sample
from .scheduler import StepPlan, Scheduler
from .sequence import SequenceState

if TYPE_CHECKING:
    from ..world.stepping import StepEngine
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
        self.context = limits.context
        self.model_name = model_name
        self.runner = Runner(engine, self.protocol, self._scratch(), limits.max_seqs)
        # prompt and generated tokens take different forms: the programs read each request's
        # prompt length, and the prefix cache keys the two roles apart (SequenceState.keys)
        self.roles = self.runner.roles
        self._token_domain = engine.domain(self.runner.ragged.inputs["token"])
        self._warm: set[tuple[int, int, int]] = set()
        self.scheduler = Scheduler(paging, limits, self.runner.decode_groups, self.runner.mixed_groups,
                                   self.protocol.max_chunk, self.runner.decode_max)
        self._ids: set[str] = set()
        self._grammars: Grammars | None = None
        self._aborted: list[Delta] = []
        self._steps = 0
        self.speculator = None  # speculative.Speculator: decode steps as rounds where it has proposals

    @property
    def limits(self) -> Limits:
        return self.scheduler.limits

    @limits.setter
    def limits(self, limits: Limits) -> None:  # the scheduler reads them: one copy
        self.scheduler.limits = limits

    @property
    def waiting(self) -> deque[SequenceState]:
        return self.scheduler.waiting

    @property
    def running(self) -> list[SequenceState]:
        return self.scheduler.running

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

    @property
    def reads_logits(self) -> bool:
        """Whether every program outputs its logits (a bias or a grammar needs them)."""
        return all("logits" in st.outputs for st in self.protocol.steppers)

    @property
    def grammars(self) -> Grammars:
        """Constrained decoding's side of the tokenizer, made on the first request with a grammar."""
        if self._grammars is None:
            width = self.engine.shapes[self.runner.decode.outputs["logits"]][1]
            self._grammars = Grammars(self.tokenizer, width, self.eos)
        return self._grammars

    def _scratch(self):
        """A page of each paged state and a slot of each per-sequence state that padding rows
        of a captured decode batch write to; no sequence reads them."""
        lease = self.paging.lease([], self.paging.page_tokens, cache=False).lease
        self.paging.extend(lease, [0] * self.paging.page_tokens)
        self._scratch_lease = lease
        return lease

    def warm_up(self, sizes: list[int] | None = None, reach: int | None = None, progress: bool = True) -> int:
        """Run each decode batch size (default: every captured size) at each reach bucket up
        to `reach` (default: the context) once on the scratch page, one step and a run-ahead,
        so that requests replay graphs and never capture one. A no-op where the device
        captures none. Returns the steps run."""
        if not self.runner.graphs:
            return 0
        reaches = self.runner.reach_buckets(reach or self.context)
        k = self.limits.run_ahead
        ahead = set(self.runner.ahead_sizes)
        todo = [(n, r, steps) for n in (sizes or self.runner.sizes) for r in reaches
                for steps in ([1, k] if k > 1 and r >= k and n in ahead else [1])]
        todo = [t for t in todo if t not in self._warm]
        if progress and todo:
            from tqdm import tqdm

            todo = tqdm(todo, desc="[kern] capturing decode graphs", unit="graph", file=sys.stderr)
        feed = self.runner.scratch_feed
        for n, r, steps in todo:
            # one row reaches r (the graph's reach bucket), the rest stay at position 0: the
            # same graph, without the device attending over r positions n times
            if steps == 1:
                self.runner.run([feed(r - 1)] + [feed(0)] * (n - 1), logits=False)
            else:
                self.runner.run_ahead([feed(r - steps, steps)] + [feed(0, steps)] * (n - 1), steps)
            self._warm.add((n, r, steps))
        return len(todo) + (self.speculator.warm_up(self) if self.speculator is not None else 0)

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
        context_room(len(prompt_ids), self.context, params.max_tokens, f"request {request_id!r}: ")
        if not self.paging.fits(len(prompt_ids) + params.max_tokens):
            raise BoundsError(f"request {request_id!r}: {len(prompt_ids) + params.max_tokens} tokens never fit the "
                              "state budget: raise --memory or shorten the request")
        if params.shaped and not self.reads_logits and not (self.runner.masks and params.device_masks):
            raise BoundsError(f"request {request_id!r}: logit_bias and grammars need the logits, which this "
                              "deployment's programs do not output")
        constraint = self.grammars.matcher(params.grammar) if params.grammar is not None else None
        seed = params.seed if params.seed is not None else seed_of(request_id)
        text = TextStream(self.tokenizer, params.stop, prompt_ids)
        self.scheduler.waiting.append(SequenceState(request_id, list(prompt_ids), params, text, seed,
                                                    constraint=constraint, roles=self.roles))
        self._ids.add(request_id)

    def abort(self, request_id: str) -> None:
        """Free the request's lease now; its Delta (finish "abort") comes with the next step()."""
        for s in [*self.waiting, *self.running]:
            if s.id == request_id:
                self._end(s, "abort")
                self._aborted.append(self._delta(s, [], "", []))
                return

    def preempt(self, request_id: str) -> None:
        """Give a running request's memory back (Scheduler.preempt); it resumes from its
        checkpoint."""
        s = next((s for s in self.running if s.id == request_id), None)
        if s is not None:
            self.scheduler.preempt(s)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self._aborted)

    def stats(self) -> LoopStats:
        use = self.paging.pool.usage()
        u, sch = use[self.state], self.scheduler
        states = tuple((k.name, "page" if k.paged else "slot", use[k.name]["held"], use[k.name]["mapped"],
                        use[k.name]["mapped"] // k.per_chunk, use[k.name]["cached"])
                       for k in self.paging.pool.layout.kinds)
        host = self.paging.pool.host_traffic()
        sp = self.speculator.stats if self.speculator is not None else None
        return LoopStats(len(sch.waiting), len(sch.running), self._steps, sch.prompt_tokens, sch.cached_tokens,
                         u["held"], u["mapped"], states, use["chunks"]["dynamic"], use["chunks"]["unmapped"],
                         host["parked"], host["woken"], *((sp.rounds, sp.proposed, sp.accepted, sp.tokens) if sp else ()))

    # ---- the step ------------------------------------------------------------------------
    def step(self, emit: Callable[[list[Delta]], None] | None = None) -> list[Delta]:
        """One step (or one run-ahead of several): the Deltas it made. With `emit`, a run-ahead
        hands each of its steps' Deltas to emit as they land instead (the rest come back)."""
        deltas, self._aborted = self._aborted, []
        plan = self.scheduler.next(self._host_between)
        if not plan.rows:
            return deltas
        if self.speculator is not None and (out := self.speculator.round(self, plan, emit)) is not None:
            self._steps += 1
            return deltas + out
        self._steps += plan.ahead
        if plan.ahead > 1:
            return deltas + self._run_ahead(plan, emit)
        seqs, feeds = [], []
        for s, n in plan.rows:
            part = s.span(s.written, n)
            self.paging.extend(s.lease, s.keys(s.written, n))
            s.written += n
            feeds.append(Feed(part, s.written - n, Units.of(s.lease), *self._draw_at(s, s.pending == 0),
                              prompt=len(s.prompt)))
            seqs.append(s)
        emitting = [i for i, s in enumerate(seqs) if s.pending == 0]
        masked = [i for i in emitting if seqs[i].constraint is not None and not self._host_draws(seqs[i])]
        if masked:  # the device draws these under their grammars' masks: one batched call, uploaded as they come
            for i, words in zip(masked, self.grammars.bitmasks([seqs[i].constraint for i in masked])):
                feeds[i] = replace(feeds[i], mask=words)
        # only the rows the host draws copy their logits off the device
        tokens, logits = self.runner.run(feeds, [i for i in emitting if self._host_draws(seqs[i])])
        for s in seqs:
            if s.snapshots and s.written == s.snapshots[0]:
                self.paging.snapshot(s.lease)
                s.snapshots.pop(0)
        return deltas + self._postprocess([seqs[i] for i in emitting], tokens[emitting],
                                          None if logits is None else logits[emitting])

    def _host_draws(self, s: SequenceState) -> bool:
        """Whether the host reads this row's logits (to draw, penalise, truncate or report
        logprobs); otherwise the device's token is the row's token (a grammar's row drawn under
        its mask where the programs take one)."""
        p = s.params
        if p.grammar is not None and self.runner.masks and p.device_masks and (p.greedy or self.runner.samples):
            return False
        return not p.device_samples if self.runner.samples else p.needs_logits

    def _draw_at(self, s: SequenceState, emits: bool) -> tuple[float, int]:
        """The temperature and key s's feed carries: where its next token comes out of this step
        (`emits`) and the device draws it, the device's draw at its params' device_temperature
        under the key of that token; else 0 and no key (the device's argmax, unused or greedy)."""
        t = s.params.device_temperature if emits and not self._host_draws(s) else 0.0
        return t, draw_key(s.seed, len(s.out)) if t else 0

    def _host_between(self, s: SequenceState) -> bool:
        """Whether the host sees this row's token before its next step (no run-ahead, no rounds)."""
        return s.constraint is not None or self._host_draws(s)

    def _run_ahead(self, plan: StepPlan, emit: Callable[[list[Delta]], None] | None) -> list[Delta]:
        """plan.ahead decode steps of every row, one host wait: each step's tokens are appended
        (and streamed through `emit`) as they land; a row that ends mid-run keeps its tokens up
        to its end and the rest of its run is thrown away."""
        k = plan.ahead
        seqs = [s for s, _ in plan.rows]
        feeds, keys = [], [[] for _ in range(k - 1)]
        for s in seqs:
            self.paging.extend(s.lease, [s.key(s.out[-1])], ahead=k - 1)  # pages bound by the scheduler
            t, key = self._draw_at(s, True)  # the scheduler runs ahead only rows the device draws
            feeds.append(Feed([s.out[-1]], s.written, Units.of(s.lease), t, key, prompt=len(s.prompt)))
            for j in range(1, k):
                keys[j - 1].append(draw_key(s.seed, len(s.out) + j) if t else 0)
        made: list[list[int]] = [[] for _ in seqs]
        held: list[Delta] = []

        def each(j: int, tokens: np.ndarray) -> None:
            out = []
            for i, s in enumerate(seqs):
                if s.finish is not None:
                    continue
                t = int(tokens[i])
                made[i].append(t)
                _, text, finish = self._append(s, [t], [])
                if finish:
                    text += s.text.flush()
                    s.finish = finish  # its lease is handed back once the run is over
                out.append(self._delta(s, [t], text, []))
            if emit is not None:
                emit(out)
            else:
                held.extend(out)

        self.runner.run_ahead(feeds, k, keys if any(f.temperature for f in feeds) else None, each)
        for s, new in zip(seqs, made):
            written = new[:-1]  # the state of every kept token but the last is on the device
            self.paging.extend(s.lease, [s.key(t) for t in written], ahead=k - 1 - len(written))  # the rest goes back
            s.written += 1 + len(written)
            if s.finish is not None:
                # a row that ended mid-run had its slots stepped past its last kept token: a
                # recurrence cannot be rewound as pages are cut, so such a lease is not cached
                self._end(s, s.finish, cache=not (self.scheduler.recurrent and len(new) < k))
        return held

    # ---- postprocess ---------------------------------------------------------------------
    def _postprocess(self, seqs: list[SequenceState], tokens: np.ndarray, logits: np.ndarray | None) -> list[Delta]:
        chosen = [int(t) for t in tokens]
        lps: list[TokenLogprob | None] = [None] * len(seqs)
        if logits is not None:
            pick = [i for i, s in enumerate(seqs) if self._host_draws(s)]
            sub = logits[pick]
            p = [seqs[i].params for i in pick]
            if any(not q.greedy or q.penalized or q.shaped for q in p):
                toks, lp = sample(sub, p, [HostDraw(draw_key(seqs[i].seed, len(seqs[i].out))) for i in pick],
                                  [seqs[i].prompt for i in pick], [seqs[i].out for i in pick],
                                  self._allowed([seqs[i] for i in pick], sub.shape))
            else:
                toks = [chosen[i] for i in pick]
                lp = logprobs_of(sub, toks, [seqs[i].params for i in pick])
            for j, i in enumerate(pick):
                chosen[i], lps[i] = toks[j], lp[j]
        out = []
        for s, t, lp in zip(seqs, chosen, lps):
            _, text, finish = self._append(s, [t], [])
            if s.constraint is not None:
                ok = s.constraint.consume_token(t)  # a masked draw is always allowed: ok unless the grammar ended
                if finish is None and (not ok or s.constraint.is_stopped()):
                    finish = "stop"  # the grammar is complete (with ignore_eos its end token would not end it)
            out.append(self._close(s, [t], text, [lp] if lp is not None else [], finish))
        return out

    def _allowed(self, seqs: list[SequenceState], shape: tuple[int, int]) -> np.ndarray | None:
        """The tokens each row may draw: its grammar's mask, all of a step's constrained rows
        computed in one batched call; None where no row has a grammar."""
        rows = [j for j, s in enumerate(seqs) if s.constraint is not None]
        if not rows:
            return None
        allowed = np.ones(shape, bool)
        allowed[rows] = self.grammars.allowed([seqs[j].constraint for j in rows])
        return allowed

    def _append(self, s: SequenceState, new: list[int], lps: list[TokenLogprob]) -> tuple[int, str, str | None]:
        """Append tokens until one ends the request: (tokens used, new text, finish reason)."""
        text = ""
        for i, t in enumerate(new):
            s.out.append(t)
            special = (t in self.eos and not s.params.ignore_eos) or t in s.params.stop_token_ids
            if not special:
                text += s.text.push(t)
            if s.text.stopped or special:
                return i + 1, text, "stop"
            if s.left <= 0:
                return i + 1, text, "length"
        return len(new), text, None

    def _close(self, s: SequenceState, new: list[int], text: str, lps: list[TokenLogprob], finish: str | None) -> Delta:
        if finish:
            text += s.text.flush()
            self._end(s, finish)
        return self._delta(s, new, text, lps)

    def _end(self, s: SequenceState, finish: str, cache: bool = True) -> None:
        s.finish = finish
        if s.lease is not None:
            if finish == "abort" or not cache:
                self.paging.pool.free(s.lease)
            else:  # its pages stay as a cached prefix until evicted
                self.paging.pool.checkpoint(s.lease)
            s.lease = None
        self.scheduler.remove(s)
        self._ids.discard(s.id)

    @staticmethod
    def _delta(s: SequenceState, new: list[int], text: str, lps: list[TokenLogprob]) -> Delta:
        return Delta(s.id, tuple(new), text, tuple(lps), s.finish, len(s.prompt), s.cached, len(s.out))
