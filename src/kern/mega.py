"""A model as one kernel, from Python: a manifest whose decode program is one call, and whose
whole greedy generation (the prompt in chunks, then every new token) is one launch.

    model = kern.MegaModel.from_pretrained("path/to/checkpoint")
    tokens = model.generate(prompt_ids, max_tokens=128)        # one launch in all
    logits = model.decode_step(token, pos)                     # fp32 logits of one row

The manifest says which program does what through roles only: the decode program is the one
the serving protocol steps one row a sequence with; the generation program is the one without
a `batch` whose buffers carry the token, position and cu_seqlens input roles and the tokens
output role (prompts packed by cu_seqlens; tokens [sequences, new tokens]). Sequence i of a call
owns pages i * n .. i * n + n - 1 of the paged state, n pages enough for its prompt and its new
tokens; the state is sized for that at load."""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from pathlib import Path

import numpy as np

from .manifest import load_verified
from .manifest.expr import evaluate
from .manifest.protocol import derive
from .manifest.schema import Add, BufArg
from .manifest.verify import Verified
from .deployments import deployment_for
from .errors import BoundsError, KernError
from .generation.params import context_room
from .runtime.engine import Engine

TARGET = "mega"  # the generator target of the one-kernel deployment


@dataclass(frozen=True, slots=True)
class GenerationProgram:
    """The program that runs whole generations, read from its buffers' roles and shapes."""

    program: str
    token: str          # packed prompt tokens [rows var]
    position: str       # their positions
    cu_seqlens: str     # [groups var + 1]
    page_table: str     # [groups var, pages]
    tokens: str         # new tokens [groups var, new-token var]
    logits: str | None  # logits of each sequence's last row
    rows_var: str
    groups_var: str
    new_var: str


def generation_program(v: Verified) -> GenerationProgram:
    """The manifest's generation program; a KernError when it has none."""
    m = v.manifest
    for name, prog in m.programs.items():
        if prog.batch is not None or prog.once:
            continue
        touched = {a.buf for c in prog.calls for a in c.args if isinstance(a, BufArg)}
        roles = {m.buffers[b].fill: b for b in touched if m.buffers[b].fill}
        tables = [b for b in touched if m.buffers[b].kind == "input" and m.buffers[b].domain is not None
                  and m.buffers[b].domain.index_into]
        if not {"token", "position", "cu_seqlens", "tokens"} <= roles.keys() or len(tables) != 1:
            continue
        rows, cu, out = (m.buffers[roles[r]].shape for r in ("token", "cu_seqlens", "tokens"))
        groups = cu[0].add[0] if isinstance(cu[0], Add) else None
        if (len(rows) == 1 and isinstance(rows[0], str) and isinstance(groups, str) and len(out) == 2
                and out[0] == groups and isinstance(out[1], str)):
            return GenerationProgram(name, roles["token"], roles["position"], roles["cu_seqlens"], tables[0],
                                     roles["tokens"], roles.get("logits"), rows[0], groups, out[1])
    raise KernError(f"{v.base_dir}: no program runs whole generations (a program without batch whose buffers carry "
                    "the token, position, cu_seqlens and tokens roles); generate a one-kernel deployment")


class MegaModel:
    def __init__(self, manifest: str | Path, checkpoint: str | Path, *, sequences: int = 1,
                 context: int | None = None, device=None):
        """`sequences` x `context` positions of paged state are allocated (context: the
        manifest's bound by default). `device`: the engine's (default: the manifest target's)."""
        self.verified = load_verified(manifest)
        self.gen = generation_program(self.verified)
        m = self.verified.manifest
        protocol = derive(self.verified)
        self.decode = protocol.for_rows(1, 1) if any(st.rows == 1 for st in protocol.steppers) else None
        consts = self.verified.constants
        bound = {**consts, **{n: var.max for n, var in m.vars.items()}}
        pt_shape = m.buffers[self.gen.page_table].shape
        self.pages_per_seq = evaluate(pt_shape[1], bound)
        state = m.buffers[self.gen.page_table].domain.index_into
        self.page_tokens = evaluate(m.buffers[self.gen.page_table].domain.stride, bound)
        self.context = min(context or self.pages_per_seq * self.page_tokens, self.pages_per_seq * self.page_tokens)
        per_token = evaluate(m.states[state].bytes_per_token, consts)
        self.seq_pages = -(-self.context // self.page_tokens)
        budget = max(sequences, 1) * self.seq_pages * self.page_tokens * per_token
        self.engine = Engine(self.verified, checkpoint, state_budget=budget, device=device)
        self.sequences = self.engine.pages[state] // self.seq_pages

    @classmethod
    def from_pretrained(cls, path: str | Path, *, sequences: int = 1, context: int | None = None) -> "MegaModel":
        """A checkpoint folder (its one-kernel manifest generated and cached), or a deployment
        folder or manifest.json of one."""
        path = Path(path)
        if path.is_file():
            return cls(path, path.parent, sequences=sequences, context=context)
        manifest = deployment_for(path, TARGET, context)
        return cls(manifest, path, sequences=sequences, context=context)

    @property
    def launches_per_generation(self) -> int:
        return len(self.engine.launches[self.gen.program])

    def _pages(self, seqs: int) -> np.ndarray:
        if seqs > self.sequences:
            raise BoundsError(f"{seqs} sequences at {self.context} positions each: the state holds {self.sequences}; "
                              "load with sequences=...")
        table = np.zeros((seqs, self.pages_per_seq), np.int32)
        for i in range(seqs):
            table[i, :self.seq_pages] = np.arange(i * self.seq_pages, (i + 1) * self.seq_pages)
        return table

    def generate_batch(self, prompts: list[list[int]], max_tokens: int, *, start: int = 0) -> list[list[int]]:
        """Greedy `max_tokens` tokens after each prompt (all in one launch); prompts sit at positions
        start, start + 1, ... (start > 0 continues sequences whose earlier positions are in the
        state: sequence i in pages of sequence i)."""
        if not prompts or any(len(p) < 1 for p in prompts):
            raise BoundsError("generate: every prompt needs at least one token")
        context_room(start + max(len(p) for p in prompts), self.context, max_tokens, "generate: ")
        g = self.gen
        ids = np.concatenate([np.asarray(p, np.int32) for p in prompts])
        inputs = {g.token: ids,
                  g.position: np.concatenate([np.arange(start, start + len(p), dtype=np.int32) for p in prompts]),
                  g.cu_seqlens: np.concatenate([[0], np.cumsum([len(p) for p in prompts])]).astype(np.int32),
                  g.page_table: self._pages(len(prompts))}
        env = self.engine.run(g.program, {g.rows_var: len(ids), g.groups_var: len(prompts), g.new_var: max_tokens},
                              inputs)
        self._env = env
        return self.engine.read(g.tokens, env).tolist()

    def generate(self, prompt_ids: list[int], max_tokens: int) -> list[int]:
        return self.generate_batch([list(prompt_ids)], max_tokens)[0]

    def prefill(self, ids: list[int]) -> np.ndarray:
        """Consume a prompt (sequence 0, positions 0..) in the one launch; the fp32 logits of its
        last token. decode_step continues it."""
        if self.gen.logits is None:
            raise KernError("prefill: the generation program has no logits output")
        self.generate_batch([list(ids)], 1)
        return self.engine.read(self.gen.logits, self._env)[0].copy()

    def decode_step(self, token: int, pos: int, seq: int = 0) -> np.ndarray:
        """One token of sequence `seq` at position `pos` through the decode program (one launch);
        its fp32 logits."""
        st = self.decode
        if st is None or "logits" not in st.outputs:
            raise KernError("decode_step: the manifest has no one-row decode program with a logits output")
        if not 0 <= pos < self.context:
            raise BoundsError(f"decode_step: position {pos} is outside the context [0, {self.context})")
        table = self._pages(seq + 1)[seq:seq + 1]
        inputs = {st.inputs["token"]: np.array([token], np.int32), st.inputs["position"]: np.array([pos], np.int32)}
        if "cu_seqlens" in st.inputs:
            inputs[st.inputs["cu_seqlens"]] = np.array([0, 1], np.int32)
        for pt in st.page_tables:
            inputs[pt.buffer] = table[:, :prod(self.engine.shapes[pt.buffer][1:])]
        for si in st.slots:  # sequence `seq` holds slot `seq` of every per-sequence state
            inputs[si.buffer] = np.array([seq], np.int32)
        if "seq_len" in st.inputs:
            inputs[st.inputs["seq_len"]] = np.array([pos + 1], np.int32)
        env = self.engine.run(st.program, st.vars_for(1, 1, reach=pos + 1), inputs)
        return self.engine.read(st.outputs["logits"], env)[0].copy()
