"""kern from Python: load a model, generate text.

    import kern
    model = kern.load()                      # the embedded default model, on this machine's device
    out = model.generate("Hello", max_tokens=32)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .manifest import load_verified
from .manifest.protocol import derive
from .runtime.engine import DEFAULT_STATE_BUDGET, Engine, make_device
from .runtime.paging import Paging
from .runtime.errors import BoundsError, KernError
from .jsonfiles import read_object, token_ids
from .registry import default_model, deployment_for
from .tokenizer import Detokenizer, Tokenizer


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

    @property
    def prefill_tok_s(self) -> float:
        return (self.prompt_tokens - self.cached_tokens) / self.prefill_s if self.prefill_s else 0.0

    @property
    def decode_tok_s(self) -> float:
        return self.decode_steps / self.decode_s if self.decode_s else 0.0


class RawPages:
    """Pages for stepping a model by hand (tests, benches): take(k) leases k pages from the
    pool without caching; give(pages) frees them."""

    def __init__(self, paging: Paging, state: str, page_tokens: int):
        self.paging, self.state, self.page_tokens = paging, state, page_tokens
        self._leases: dict[tuple[int, ...], object] = {}

    def take(self, k: int) -> list[int]:
        n = k * self.page_tokens
        lease = self.paging.lease([], n).lease
        self.paging.extend(lease, [0] * n)
        pages = list(lease.page_table(self.state))
        self._leases[tuple(pages)] = lease
        return pages

    def give(self, pages: list[int]) -> None:
        self.paging.pool.free(self._leases.pop(tuple(pages)))


# Greedy decode steps a host wait where the device runs them as one launch: at 8 the host's
# part of a step (the launch, the wait, the read) is paid once in 8 (docs/perf.md: +3-5% tok/s
# on the H200); a stop token inside a run costs at most 7 steps' work that is thrown away.
RUN_AHEAD = 8


class Model:
    def __init__(self, manifest: Path, checkpoint: Path, *, state_budget: int = DEFAULT_STATE_BUDGET,
                 run_ahead: int | None = None, **engine_kw):
        """`run_ahead`: greedy decode steps a host wait (Engine.run_steps, the token fed back on
        the device). Default: RUN_AHEAD where the device runs them as one launch (CUDA: one graph
        for all of them), else 1 (a loop of single steps saves nothing)."""
        self.verified = load_verified(manifest)
        self.checkpoint = checkpoint
        self._tokenizer: Tokenizer | None = None
        self.protocol = derive(self.verified)
        if len(self.protocol.paged_states) != 1:
            raise KernError(f"{manifest}: kern run steps manifests with exactly one paged state, this one has "
                            f"{len(self.protocol.paged_states)}")
        (self.state, self.page_tokens), = self.protocol.paged_states.items()
        device = engine_kw.pop("device", None) or make_device(self.verified)
        self.paging = Paging(self.verified, self.page_tokens, state_budget, device.chunk_granularity)
        self.engine = Engine(self.verified, checkpoint, device=device, state_sizes=self.paging.sizes,
                             chunk_bytes=self.paging.chunk_bytes, **engine_kw)
        self.paging.bind(self.engine)
        self.alloc = RawPages(self.paging, self.state, self.page_tokens)
        self.eos = self._eos_ids(checkpoint)
        self.context = self.protocol.max_positions
        if run_ahead is None:
            native = self.engine.runs_steps_natively(self.protocol.for_rows(1, 1).program)
            run_ahead = RUN_AHEAD if native else 1
        self.run_ahead = run_ahead
        if self.run_ahead < 1:
            raise BoundsError(f"run_ahead must be at least 1, got {self.run_ahead}")

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

    # ---- one sequence: the host loop the server generalizes -------------------------------
    def _table(self, stepper, pages: list[int]) -> dict[str, np.ndarray]:
        out = {}
        for pt in stepper.page_tables:
            width = self.engine.shapes[pt.buffer][1]
            row = np.zeros((1, width), np.int32)
            row[0, :len(pages)] = pages
            out[pt.buffer] = row
        return out

    def step_rows(self, ids: list[int], start: int, pages: list[int], ragged: bool = False):
        """Run `ids` at positions start.. of one sequence; return (next token, logits).
        One row goes through the decode program unless ragged (prefill) is asked for."""
        st = self.protocol.for_rows(1, None if ragged or len(ids) > 1 else 1)
        inputs = {st.inputs["token"]: np.array(ids, np.int32),
                  st.inputs["position"]: np.arange(start, start + len(ids), dtype=np.int32),
                  **self._table(st, pages)}
        if "cu_seqlens" in st.inputs:
            inputs[st.inputs["cu_seqlens"]] = np.array([0, len(ids)], np.int32)
        env = self.engine.run(st.program, st.vars_for(1, len(ids), reach=start + len(ids)), inputs)
        tok = int(self.engine.read(st.outputs["tokens"], env)[0])
        logits = self.engine.read(st.outputs["logits"], env)[0] if "logits" in st.outputs else None
        return tok, logits

    def generate(self, prompt: str | list[int], *, chat: bool = False, max_tokens: int = 64,
                 temperature: float = 0.0, seed: int = 0, on_text: Callable[[str], None] | None = None) -> Generation:
        if isinstance(prompt, str):
            text = self.tokenizer.chat([{"role": "user", "content": prompt}]) if chat else prompt
            ids = self.tokenizer.encode(text)
        else:
            ids = list(prompt)
        if not ids:
            raise BoundsError("empty prompt")
        if max_tokens < 1:
            raise BoundsError(f"max_tokens must be at least 1, got {max_tokens}")
        if self.context is not None and len(ids) >= self.context:
            raise BoundsError(f"prompt of {len(ids)} tokens does not fit the context bound of {self.context} "
                              "positions (the position input's domain; the prompt plus one generated token)")
        max_tokens = min(max_tokens, self.context - len(ids)) if self.context else max_tokens
        rng = np.random.Generator(np.random.PCG64(seed))
        grant = self.paging.lease(ids, len(ids) + max_tokens)
        lease = grant.lease
        detok = Detokenizer(self.tokenizer)
        out: list[int] = []
        try:
            t0 = time.perf_counter()
            chunk = self.protocol.max_chunk
            pos = grant.cached  # tokens whose state a cached prefix already holds
            while pos < len(ids):
                part = ids[pos:pos + chunk]
                self.paging.extend(lease, part)
                nxt, logits = self.step_rows(part, pos, lease.page_table(self.state), ragged=True)
                pos += len(part)
            t1 = time.perf_counter()
            finish = "length"
            ahead = self.run_ahead if temperature <= 0 else 1
            made = [nxt if temperature <= 0 else self._sample(logits, temperature, rng)]  # not yet emitted
            while True:
                written = []  # emitted tokens whose state the last run wrote (all but its last)
                for i, tok in enumerate(made):
                    out.append(tok)
                    piece = detok.push(tok)
                    if piece and on_text:
                        on_text(piece)
                    if tok in self.eos:
                        finish = "stop"
                        break
                    if len(out) >= max_tokens:
                        break
                    if i < len(made) - 1:
                        written.append(tok)
                if len(made) > 1:  # the run's state past these tokens is not kept
                    self.paging.extend(lease, written, ahead=len(made) - 1 - len(written))
                if finish == "stop" or len(out) >= max_tokens:
                    break
                n = min(ahead, max_tokens - len(out))
                pos = len(ids) + len(out) - 1
                self.paging.extend(lease, [out[-1]], ahead=n - 1)
                if n == 1:
                    nxt, logits = self.step_rows([out[-1]], pos, lease.page_table(self.state))
                    made = [nxt if temperature <= 0 else self._sample(logits, temperature, rng)]
                else:
                    made = self._decode_run(out[-1], pos, n, lease.page_table(self.state))
            steps = len(out) - 1
            t2 = time.perf_counter()
        except BaseException:
            self.paging.pool.free(lease)
            raise
        self.paging.pool.checkpoint(lease)  # its pages stay as a cached prefix until evicted
        return Generation(self.tokenizer.decode(out), out, len(ids), t1 - t0, t2 - t1, finish, steps,
                          cached_tokens=grant.cached)

    def _decode_run(self, tok: int, pos: int, n: int, pages: list[int]) -> list[int]:
        """n greedy decode steps of one sequence from `tok` at `pos`, one host wait: the tokens."""
        st = self.protocol.for_rows(1, 1)
        inputs = {st.inputs["token"]: np.array([tok], np.int32), st.inputs["position"]: np.array([pos], np.int32),
                  **self._table(st, pages)}
        if "cu_seqlens" in st.inputs:
            inputs[st.inputs["cu_seqlens"]] = np.array([0, 1], np.int32)
        outs = self.engine.run_steps(st.program, st.vars_for(1, 1, reach=pos + n), inputs,
                                     [{st.inputs["position"]: np.array([pos + j], np.int32)} for j in range(1, n)],
                                     feedback={st.outputs["tokens"]: st.inputs["token"]}, collect=[])
        return [int(o[st.outputs["tokens"]][0]) for o in outs]

    @staticmethod
    def _sample(logits, temperature, rng) -> int:
        z = logits.astype(np.float64) / temperature
        z -= z.max()
        p = np.exp(z)
        p /= p.sum()
        return int(rng.choice(len(p), p=p))


def load(model: str | Path | None = None, *, manifest: str | Path | None = None, target: str = "cpu",
         progress: bool = True, **engine_kw) -> Model:
    """Load a model: None = the embedded default; a checkpoint folder (with or without its own
    manifest.json); or a deployment folder's manifest given with manifest=."""
    ckpt = default_model(progress) if model is None else Path(model)
    if not ckpt.is_dir():
        raise KernError(f"{ckpt}: not a folder")
    man = Path(manifest) if manifest else deployment_for(ckpt, target)
    return Model(man, ckpt, **engine_kw)
