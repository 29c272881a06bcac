"""kern from Python: load a model, generate text.

    import kern
    model = kern.load()                      # the embedded default model, on this machine's device
    out = model.generate("Hello", max_tokens=32)
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Self

from .generation.limits import limits_for
from .generation.loop import Loop
from .generation.outputs import Delta
from .generation.params import DEFAULT_MAX_TOKENS, SamplingParams
from .generation.speculative import SPEC_FIELDS, SpecStats, Speculate
from .speculation import speculator_for
from .manifest import load_verified
from .world.stepping import open_engine
from .errors import KernError
from .errors import BoundsError
from .manifest.problems import ManifestError, OverBudget
from .files.jsonfiles import read_object, token_ids
from .deployments import default_model, deployment_for, refuse_faster_build, refuse_step_tokens
from .tokenizer import Tokenizer


@dataclass
class Generation:
    text: str
    tokens: list[int]
    prompt_tokens: int
    prefill_s: float
    decode_s: float
    finish_reason: str
    decode_steps: int = field(default=0)
    cached_tokens: int = field(default=0)
    speculation: SpecStats | None = field(default=None)  # the rounds this generation ran (speculating models)

    @property
    def prefill_tok_s(self) -> float:
        return (self.prompt_tokens - self.cached_tokens) / self.prefill_s if self.prefill_s else 0.0

    @property
    def decode_tok_s(self) -> float:
        return self.decode_steps / self.decode_s if self.decode_s else 0.0


# Greedy decode steps a host wait where the device runs them as one launch: at 8 the host's
# part of a step (the launch, the wait, the read) is paid once in 8 (the gain: docs/perf.md); a
# stop token inside a run costs at most 7 steps' work that is thrown away.
RUN_AHEAD = 8


class Model:
    def __init__(self, manifest: Path, checkpoint: Path, *, state_budget: int | None = None,
                 run_ahead: int | None = None, context: int | None = None, max_seqs: int | None = None,
                 host_bytes: int | None = 0, device=None, speculate: str | Speculate | None = None, pp: int = 1):
        """`run_ahead`: greedy decode steps a host wait (Engine.run_steps, the token fed back on
        the device) when one sequence runs alone. Default: RUN_AHEAD where the device runs them
        as one launch (CUDA: one graph for all of them), else 1 (a loop of single steps saves
        nothing). `context`: positions a sequence may reach (default: the manifest's bound,
        clipped to what the state budget holds for one sequence). `max_seqs`: sequences
        running at once (default: what the state budget holds, up to the programs' bound).
        `state_budget`: bytes of state memory (None: 90% of a GPU less what the weights take,
        512 MiB on the cpu; auto_budget in runtime/paging.py). `host_bytes`: host memory that idle
        sessions' cached prefixes park in under pressure and wake from (None: twice the state
        budget, at most a quarter of the machine's memory; 0: none, they are dropped).
        `speculate`: `ngram[:K]` or `draft:DIR[:K]` (docs/speculative.md): decode steps become
        rounds of proposed tokens verified at once, the tokens unchanged. `pp`: pipeline stages,
        kern cut's stages on that many devices (docs/pipeline.md)."""
        self.verified = load_verified(manifest)
        self.checkpoint = checkpoint
        self._tokenizer: Tokenizer | None = None
        self.engine = open_engine(self.verified, checkpoint, device=device, state_budget=state_budget, paged=True,
                                  host_bytes=host_bytes, pp=pp)
        self.protocol, self.paging = self.engine.protocol, self.engine.paging
        if self.paging.state is None:
            raise KernError(f"{manifest}: kern steps manifests with at least one paged state, this one has none")
        self.state, self.page_tokens = self.paging.state, self.paging.page_tokens
        if run_ahead is None:
            native = self.engine.runs_steps_natively(self.protocol.for_rows(1, 1).program)
            run_ahead = RUN_AHEAD if native else 1
        if run_ahead < 1:
            raise BoundsError(f"run_ahead must be at least 1, got {run_ahead}")
        limits = limits_for(self.protocol, self.paging.fits, self.paging.page_tokens, context, max_seqs, run_ahead,
                            scratch_tokens=self.paging.page_tokens, capacity=self.paging.capacity())
        if limits.note:
            print(f"[kern] {limits.note}", file=sys.stderr)
        note = getattr(self.engine, "memory_note", "state memory")  # a split deployment's ranks: their own
        print(f"[kern] {note}: {self.paging.capacity():,} tokens, up to {limits.max_seqs} sequences of up to "
              f"{limits.context:,} positions", file=sys.stderr)
        lay = self.paging.pool.layout
        if lay.host_chunks:
            print(f"[kern] host memory {lay.host_chunks * lay.chunk_bytes / 2**30:.1f} GiB: idle sessions park "
                  "there under pressure and wake without recomputing", file=sys.stderr)
        self.loop = Loop(self.engine, self.paging, lambda: self.tokenizer, self._eos_ids(checkpoint), limits,
                         self.verified.manifest.model)
        self.context = self.loop.context
        self._n = 0
        self.loop.speculator = speculator_for(speculate, self) if speculate is not None else None

    def close(self) -> None:
        """Give the model's device memory back (weights, states, graphs: Engine.close); a
        generation afterwards is refused. `with Model(...) as m:` closes at the block's end."""
        self.engine.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def run_ahead(self) -> int:
        """Greedy decode steps a host wait when one sequence runs alone (the loop's limit)."""
        return self.loop.limits.run_ahead

    @run_ahead.setter
    def run_ahead(self, k: int) -> None:
        if k < 1:
            raise BoundsError(f"run_ahead must be at least 1, got {k}")
        self.loop.limits = replace(self.loop.limits, run_ahead=k)

    @property
    def tokenizer(self) -> Tokenizer:
        """Loaded on first use: a model can be stepped on token ids without one."""
        if self._tokenizer is None:
            self._tokenizer = Tokenizer(self.checkpoint)
        return self._tokenizer

    @staticmethod
    def _eos_ids(folder: Path) -> set[int]:
        ids: set[int] = set()
        for name in ("generation_config.json", "config.json"):
            p = folder / name
            if p.exists():
                ids.update(token_ids(p, read_object(p), "eos_token_id"))
        return ids

    def _ids(self, prompt: str | list[int], chat: bool) -> list[int]:
        if not isinstance(prompt, str):
            return list(prompt)
        text = self.tokenizer.chat([{"role": "user", "content": prompt}]) if chat else prompt
        return self.tokenizer.encode(text)

    def _request_id(self) -> str:
        self._n += 1
        return f"model-{self._n}"

    def warm_up(self, progress: bool = True) -> int:
        """Capture every graph the loop can use (each decode batch size at each reach), so no
        request pays a capture; the server calls it at start-up. Returns the steps run."""
        return self.loop.warm_up(progress=progress)

    def generate(self, prompt: str | list[int], *, chat: bool = False, max_tokens: int = DEFAULT_MAX_TOKENS,
                 temperature: float = 0.0, seed: int = 0, on_text: Callable[[str], None] | None = None,
                 **sampling) -> Generation:
        """One prompt through the loop; `sampling`: the other SamplingParams fields."""
        ids = self._ids(prompt, chat)
        params = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed, **sampling)
        rid = self._request_id()
        self.loop.add(rid, ids, params)
        self.loop.warm_up(sizes=[1], reach=len(ids) + params.max_tokens, progress=False)
        spec = self.loop.speculator
        before = replace(spec.stats) if spec else None
        out = self._drive({rid: on_text})[rid]
        if spec:
            now = spec.stats
            out.speculation = SpecStats(*(getattr(now, f) - getattr(before, f) for f in SPEC_FIELDS))
        return out

    def generate_batch(self, prompts: list[str | list[int]],
                       params: SamplingParams | list[SamplingParams] | None = None, *,
                       chat: bool = False) -> list[Generation]:
        """Many prompts at once through the loop (continuous batching); results in prompt order."""
        plist = params if isinstance(params, list) else [params or SamplingParams()] * len(prompts)
        if len(plist) != len(prompts):
            raise BoundsError(f"generate_batch: {len(prompts)} prompts but {len(plist)} SamplingParams")
        rids = []
        try:
            for p, sp in zip(prompts, plist):
                rid = self._request_id()
                self.loop.add(rid, self._ids(p, chat), sp)
                rids.append(rid)
        except BaseException:
            for rid in rids:
                self.loop.abort(rid)
            self._drain()
            raise
        done = self._drive({rid: None for rid in rids})
        return [done[rid] for rid in rids]

    def _drain(self) -> None:
        while self.loop.has_work():
            self.loop.step()

    def _drive(self, want: dict[str, Callable[[str], None] | None]) -> dict[str, Generation]:
        """Step the loop until every request in `want` has finished: their Generations."""
        acc = {rid: _Acc(time.perf_counter()) for rid in want}
        done: dict[str, Generation] = {}
        try:
            while len(done) < len(want):
                for d in self.loop.step():
                    a = acc.get(d.request_id)
                    if a is None:
                        continue
                    a.add(d, time.perf_counter())
                    if d.text and want[d.request_id]:
                        want[d.request_id](d.text)
                    if d.finish_reason:
                        done[d.request_id] = a.result(d)
        except BaseException:
            for rid in want:
                if rid not in done:
                    self.loop.abort(rid)
            self._drain()
            raise
        return done


@dataclass
class _Acc:
    """A request's tokens and clock as its Deltas arrive."""

    t0: float
    tokens: list[int] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    first: float | None = None
    last: float = 0.0

    def add(self, d: Delta, now: float) -> None:
        if d.token_ids and self.first is None:
            self.first = now
        self.tokens += d.token_ids
        self.text.append(d.text)
        self.last = now

    def result(self, d: Delta) -> Generation:
        first = self.first if self.first is not None else self.last
        return Generation("".join(self.text), self.tokens, d.prompt_tokens, first - self.t0, self.last - first,
                          d.finish_reason, max(len(self.tokens) - 1, 0), cached_tokens=d.cached_tokens)


def _repo_hint(text: str) -> str:
    """What to say when a model that is not a folder reads like a Hugging Face repo id."""
    if text.count("/") != 1 or text.startswith((".", "/", "~")):
        return ""
    return (f" (kern reads models from local folders only and never downloads one: fetch it first, "
            f"e.g. `hf download {text} --local-dir DIR`, then give DIR)")


def load(model: str | Path | None = None, *, manifest: str | Path | None = None, weights: str | Path | None = None,
         target: str = "cpu",
         context: int | None = None, max_seqs: int | None = None, state_budget: int | None = None,
         progress: bool = True, tp: int = 1, ep: int = 1, pp: int = 1, batch_invariant: bool = True,
         speculate: str | Speculate | None = None, step_tokens: int | None = None, **model_kw) -> Model:
    """Load a model: None = the embedded default; a checkpoint folder (with or without its own
    manifest.json); a deployment folder (manifest.json and kernels, no weights) binding the
    checkpoint folder `weights` (default: the embedded model's); or a deployment folder's
    manifest given with manifest=. `context`:
    positions a sequence may reach (default: the generator's, from the model's own; clipped
    to what the memory holds);
    `max_seqs`: sequences running at once; `state_budget`: bytes of state memory (each rank's).
    `tp`: tensor-parallel ranks, the model split over that many devices (docs/tensor-parallel.md);
    a deployment generated for it, or the rank manifest given with manifest=. `ep`: expert-
    parallel ranks, a mixture of experts' experts split over that many devices
    (docs/expert-parallel.md), likewise. `pp`: pipeline stages, the deployment cut into that many
    stages (kern cut) on as many devices, micro-batches in flight (docs/pipeline.md); not with
    tp or ep above 1. `batch_invariant=False`: a generated GPU deployment
    whose many-row programs are faster but whose bytes depend on the batch (docs/determinism.md).
    `speculate`: `"ngram[:K]"` or `"draft:DIR[:K]"` (docs/speculative.md). `step_tokens`: the
    most prompt tokens a step feeds, a generated deployment's prefill rows (None: the family's)."""
    for name, v in (("context", context), ("max_seqs", max_seqs), ("state_budget", state_budget), ("tp", tp),
                    ("ep", ep), ("pp", pp), ("step_tokens", step_tokens)):
        if v is not None and (not isinstance(v, int) or v < 1):
            raise BoundsError(f"{name} must be a positive integer, got {v!r}")
    if pp > 1 and max(tp, ep) > 1:
        raise KernError(f"--pp {pp} with --{'tp' if tp > 1 else 'ep'} {max(tp, ep)}: pipeline stages of a split "
                        "deployment are not supported yet; give one of them")
    ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    if target == "cpu" and state_budget is not None and state_budget > ram:  # the pool's bookkeeping alone would not fit
        raise BoundsError(f"state budget (--memory) {state_budget / 2**30:.4g} GiB is more than this machine has ({ram / 2**30:.4g} GiB)")
    ckpt = default_model(progress) if model is None else Path(model)
    if not ckpt.is_dir():
        raise KernError(f"{ckpt}: not a folder{_repo_hint(str(model)) if model is not None else ''}")
    if (ckpt / "manifest.json").is_file() and not any(ckpt.glob("*.safetensors")):
        # a deployment folder: a manifest and its kernels, binding another folder's weights
        if manifest:
            raise KernError(f"{ckpt}: a deployment folder (manifest.json, no weights) and --manifest {manifest}: "
                            "give one manifest")
        manifest, ckpt = ckpt / "manifest.json", Path(weights) if weights else default_model(progress)
        if not ckpt.is_dir():
            raise KernError(f"--weights {ckpt}: not a folder")
    elif weights:
        raise KernError(f"--weights {weights}: {ckpt} holds its own weights (--weights goes with a deployment "
                        "folder: manifest.json and kernels, no .safetensors)")
    if manifest and target != "cpu":
        refuse_faster_build(f"{manifest}: a manifest is given", batch_invariant,
                            "leave out --manifest, or give a manifest built with batch_invariant=False")
    if manifest:
        refuse_step_tokens(f"{manifest}: a manifest is given", step_tokens,
                           "leave out --manifest, or give one generated with those prefill rows")
    man = Path(manifest) if manifest else deployment_for(ckpt, target, context=context, tp=tp, ep=ep,
                                                         batch_invariant=batch_invariant, step_tokens=step_tokens)
    if pp > 1:
        model_kw["pp"] = pp
    try:
        return Model(man, ckpt, context=context, max_seqs=max_seqs,
                     state_budget=state_budget, speculate=speculate, **model_kw)
    except ManifestError as exc:
        # a step so wide that its buffers outgrow the device: the option is what to name, not a buffer
        over = [p for p in exc.problems if isinstance(p, OverBudget)]
        if step_tokens is None or not over:
            raise
        raise KernError(f"--step-tokens {step_tokens}: the deployment it sizes {over[0].need}; give fewer") from None
