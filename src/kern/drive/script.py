"""A seeded script of steps (kern test's workload, kern bench's context prefixes): prompts,
chunked prefill, decode steps, page tables.

Pure. Half of the prompt lengths are uniform, half sit on boundaries (a page +/- 1, the
prefill chunk +/- 1, the rows bound); prompts are cut into chunks that several sequences share
in one ragged step; every sequence then decodes a few rows, one per step (teacher-forced), and,
where the manifest has a verify program, ends with a speculative round of ROUND_ROWS rows.
Tokens are random from the token domain, or, given a corpus (a tokenized text), windows of it
at seeded offsets: natural-ish prompts, whose predictions are decisive where random tokens
leave near-ties everywhere. Pages are a shuffled permutation of [0, pages_used), so page
tables really indirect, and the whole workload lives in the first pages_used pages of each
paged state."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..manifest.protocol import PROMPT_ALL, Stepper


@dataclass(frozen=True, slots=True)
class Bounds:
    """What the reference's protocol allows (all from the manifest, no names)."""

    vocab: tuple[int, int]  # token domain [lo, hi)
    page_tokens: int
    chunk: int  # rows of one ragged step
    ragged_groups: int
    decode_groups: int
    context: int  # positions domain: prompt + decode rows fit below it
    table_width: int  # pages one sequence may hold
    pages: int  # pages of the paged state
    round_groups: int = 0  # sequences one verify step takes (0: no verify program)
    round_rows: int = 0  # rows one verify step takes
    keys: int | None = None  # prompt keys one ragged step may attend over (Batch.keys; None: no bound)


@dataclass(frozen=True, slots=True)
class Seq:
    prompt: tuple[int, ...]
    decode: tuple[int, ...]  # the token fed at each decode step
    pages: tuple[int, ...]
    why: str  # "uniform" or the boundary, e.g. "page+1"


@dataclass(frozen=True, slots=True)
class Chunk:
    seq: int
    start: int  # position of the first row
    tokens: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ScriptStep:
    ragged: bool  # through the ragged (prefill) stepper, else one row per sequence
    chunks: tuple[Chunk, ...]
    round: bool = False  # a speculative round: through the verify program (ragged)

    @property
    def rows(self) -> int:
        return sum(len(c.tokens) for c in self.chunks)


@dataclass(frozen=True, slots=True)
class Script:
    seed: int
    seqs: tuple[Seq, ...]
    steps: tuple[ScriptStep, ...]
    pages_used: int
    natural: str = ""  # "" random tokens, "all" or "half" of the sequences from a corpus

    def describe(self) -> str:
        lens = ", ".join(f"{len(s.prompt)} ({s.why})" for s in self.seqs)
        n_pre = sum(s.ragged and not s.round for s in self.steps)
        n_round = sum(s.round for s in self.steps)
        return (f"workload: seed {self.seed}, {len(self.seqs)} sequences of "
                f"{_KIND[self.natural]}, prompts {lens}; "
                f"{n_pre} prefill steps, {len(self.steps) - n_pre - n_round} decode steps"
                f"{f', {n_round} speculative round steps' if n_round else ''}; {self.pages_used} pages")


_KIND = {"": "random tokens", "all": "natural-ish text", "half": "natural-ish text (uniform lengths) and random tokens"}


def boundaries(lim: Bounds) -> dict[str, int]:
    p, c = lim.page_tokens, lim.chunk
    return {"page-1": p - 1, "page": p, "page+1": p + 1, "2page+1": 2 * p + 1,
            "chunk-1": c - 1, "chunk": c, "chunk+1": c + 1}


# Rows a sequence feeds in the workload's speculative round (its last token and 2 proposed).
ROUND_ROWS = 3


def make(seed: int, lim: Bounds, *, seqs: int = 6, decode_steps: int = 4, max_prompt: int | None = None,
         corpus: tuple[int, ...] | None = None, mixed: bool = False) -> Script:
    """mixed: with a corpus, only the uniform-length sequences take its text; the boundary
    ones keep random tokens, whose near-ties are where a subtle bug flips the argmax."""
    rng = np.random.Generator(np.random.PCG64(seed))
    rounds = ROUND_ROWS if lim.round_groups and lim.round_rows >= ROUND_ROWS else 0
    steps_in, decode_steps = decode_steps, decode_steps + rounds  # a round's rows follow the decode rows
    top = min(lim.context - decode_steps, lim.table_width * lim.page_tokens - decode_steps)
    # default cap: past one chunk and two pages, so chunked prefill and page crossings are fed,
    # without prompts as long as the context (minutes on a cpu reference)
    top = min(top, max_prompt if max_prompt is not None else lim.chunk + 2 * lim.page_tokens)
    if top < 1:
        raise ValueError(f"no prompt fits: context {lim.context}, {decode_steps} decode steps")
    edges = [(k, n) for k, n in boundaries(lim).items() if 1 <= n <= top]
    picks: list[tuple[int, str]] = []
    order = rng.permutation(len(edges)) if edges else []
    for i in range(seqs):
        if i % 2 == 1 and edges:
            k, n = edges[int(order[(i // 2) % len(edges)])]
            picks.append((n, k))
        else:
            picks.append((int(rng.integers(1, top + 1)), "uniform"))
    need = [-(-(n + decode_steps) // lim.page_tokens) for n, _ in picks]
    if sum(need) > lim.pages:
        raise ValueError(f"the workload needs {sum(need)} pages, the paged state has {lim.pages}")
    perm = [int(x) for x in rng.permutation(sum(need))]
    lo, hi = lim.vocab
    text = tuple(t for t in corpus if lo <= t < hi) if corpus else ()
    out: list[Seq] = []
    at = 0
    for (n, why), k in zip(picks, need):
        if len(text) > n + decode_steps and not (mixed and why != "uniform"):
            o = int(rng.integers(0, len(text) - n - decode_steps))
            prompt, dec = text[o:o + n], text[o + n:o + n + decode_steps]
        else:
            prompt = tuple(int(x) for x in rng.integers(lo, hi, n))
            dec = tuple(int(x) for x in rng.integers(lo, hi, decode_steps))
        out.append(Seq(prompt, dec, tuple(perm[at:at + k]), why))
        at += k
    natural = "" if not text else "half" if mixed and any(why != "uniform" for _, why in picks) else "all"
    return Script(seed, tuple(out), _schedule(out, lim, steps_in, rounds), sum(need), natural)


def pack(todo: list[tuple[int, int, int]], lim: Bounds, tokens, done: list[int]) -> list[Chunk]:
    """One ragged step's prompt chunks, in order: todo [(sequence, fed so far, prompt length)],
    within the step's rows, sequences and (where the manifest counts them) prompt keys: a chunk
    of k rows from position at attends over at + k keys (every row a prompt row). `tokens(i,
    at, k)`: its tokens; `done` advanced. The first chunk always goes (one prompt fits a step's
    keys: the context is at most the bound)."""
    budget, keys, chunks = lim.chunk, lim.keys, []
    for i, at, n in todo:
        if at < n and budget > 0 and len(chunks) < lim.ragged_groups:
            k = min(budget, n - at)
            if keys is not None:
                k = min(k, keys - at)
                if k < 1 and chunks:
                    continue
                k = max(k, 1)
                keys -= at + k
            chunks.append(Chunk(i, at, tokens(i, at, k)))
            done[i] += k
            budget -= k
    return chunks


def _schedule(seqs: list[Seq], lim: Bounds, decode_steps: int, rounds: int) -> tuple[ScriptStep, ...]:
    steps: list[ScriptStep] = []
    done = [0] * len(seqs)
    while any(d < len(s.prompt) for d, s in zip(done, seqs)):
        steps.append(ScriptStep(True, tuple(pack([(i, done[i], len(s.prompt)) for i, s in enumerate(seqs)], lim,
                                                 lambda i, at, k: seqs[i].prompt[at:at + k], done))))
    for d in range(decode_steps):
        rows = [Chunk(i, len(s.prompt) + d, (s.decode[d],)) for i, s in enumerate(seqs)]
        for g in range(0, len(rows), lim.decode_groups):
            steps.append(ScriptStep(False, tuple(rows[g:g + lim.decode_groups])))
    if rounds:  # each sequence's next rows as one round's (teacher-forced, like the decode rows)
        rows = [Chunk(i, len(s.prompt) + decode_steps, s.decode[decode_steps:decode_steps + rounds])
                for i, s in enumerate(seqs)]
        per = max(1, min(lim.round_groups, lim.round_rows // rounds))
        for g in range(0, len(rows), per):
            steps.append(ScriptStep(True, tuple(rows[g:g + per]), round=True))
    return tuple(steps)


def feed(step: ScriptStep, st: Stepper, seqs: tuple[Seq, ...], widths: dict[str, int]) -> tuple[dict, dict]:
    """The vars and the role-filled input buffers of one step for one engine's stepper."""
    groups = len(step.chunks)
    draws = step.rows if "accepted" in st.outputs else groups
    vars = st.vars_for(groups, step.rows, reach=max(c.start + len(c.tokens) for c in step.chunks))
    ins: dict[str, np.ndarray] = {}
    roles = {
        "token": np.array([t for c in step.chunks for t in c.tokens], np.int32),
        "position": np.concatenate([np.arange(c.start, c.start + len(c.tokens)) for c in step.chunks]).astype(np.int32),
        "cu_seqlens": np.cumsum([0] + [len(c.tokens) for c in step.chunks]).astype(np.int32),
        "seq_len": np.array([c.start + len(c.tokens) for c in step.chunks], np.int32),
        "slot": np.array([c.seq for c in step.chunks], np.int32),
        # greedy: the judged tokens are each side's argmax (a verify program draws a token a row)
        "temperature": np.zeros(draws, np.float32),
        "rng": np.zeros((draws, 2), np.int32),
        "mask_row": np.zeros(draws, np.int32),  # no row masked (the mask's words are never read)
        "prompt_len": np.full(groups, PROMPT_ALL, np.int32),  # a script's rows are all prompt tokens
    }
    for role, buf in st.inputs.items():
        if role != "mask":
            ins[buf] = roles[role]
    for si in st.slots:  # kern test's sequence i runs on slot i of every per-sequence state
        ins[si.buffer] = roles["slot"]
    for pt in st.page_tables:
        table = np.zeros((groups, widths[pt.buffer]), np.int32)
        for g, c in enumerate(step.chunks):
            pages = seqs[c.seq].pages
            table[g, :len(pages)] = pages
        ins[pt.buffer] = table
    return vars, ins
