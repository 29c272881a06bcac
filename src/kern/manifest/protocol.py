"""The serving protocol, derived from a verified manifest: which program steps (groups, rows),
which buffer carries which role, and which inputs are page tables into which paged state.

kern run, kern serve, kern test and kern bench drive the runtime only through this, never by names."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import KernError
from .expr import evaluate
from .schema import INPUT_ROLES, BufArg
from .verify import Verified


REACH_MIN = 64  # the smallest reach bucket


class ProtocolError(KernError, ValueError):
    """The manifest cannot serve what was asked; names the program, var or role."""


@dataclass(frozen=True, slots=True)
class PageTable:
    buffer: str
    state: str
    page_tokens: int


@dataclass(frozen=True, slots=True)
class SlotInput:
    """An input of the `slot` role: each sequence's slot of one per-sequence state."""

    buffer: str
    state: str


@dataclass(frozen=True, slots=True)
class Stepper:
    """One program that steps a batch."""

    program: str
    groups_var: str | None  # the var set to the number of sequences (None: fixed)
    groups_max: int
    rows: int | None  # rows per group when fixed (decode: 1); None when ragged
    rows_var: str | None  # the var set to the total rows when ragged
    rows_max: int
    inputs: dict[str, str]  # role -> buffer
    outputs: dict[str, str]  # role -> buffer
    page_tables: tuple[PageTable, ...]
    slots: tuple[SlotInput, ...] = ()  # the `slot` role's inputs, one per per-sequence state it reads
    reach_var: str | None = None  # the var set to the positions a step reaches (bucketed)
    reach_max: int = 0
    mask_var: str | None = None  # the var set to the rows of the `mask` input a step fills (bucketed)
    mask_max: int = 0  # the most rows the `mask` input holds (0: no mask input)
    keys_var: str | None = None  # the var set to the prompt keys a step's rows attend over (prompt_keys)
    keys_max: int = 0

    @property
    def ragged(self) -> bool:
        return self.rows is None

    def reach_bucket(self, reach: int) -> int:
        """The bucket of a step whose rows reach `reach` positions (largest position + 1): the
        next power of two, at least REACH_MIN, at most the var's bound. Few buckets: few graphs."""
        if reach < 1 or reach > self.reach_max:
            raise ProtocolError(f"program {self.program!r}: a step reaching {reach} positions is outside the var "
                                f"bound {self.reach_var} <= {self.reach_max}")
        return min(max(REACH_MIN, 1 << (reach - 1).bit_length()), self.reach_max)

    def mask_bucket(self, masked: int) -> int:
        """The rows of the `mask` input a step with `masked` masked rows fills: with a mask var
        the next power of two, at least 1 (a step without one copies up a single row), at most
        the var's bound (few buckets: few graphs); else the input's fixed rows."""
        if masked > self.mask_max:
            raise ProtocolError(f"program {self.program!r}: {masked} masked rows is more than its mask input "
                                f"holds ({self.mask_var or 'rows'} <= {self.mask_max})")
        if self.mask_var is None:
            return self.mask_max
        return min(1 << max(masked - 1, 0).bit_length(), self.mask_max)

    def vars_for(self, groups: int, rows: int, reach: int | None = None, masked: int = 0) -> dict[str, int]:
        """The var values for a step of `groups` sequences and `rows` rows in all whose rows
        reach `reach` positions (largest position + 1; None: the reach var stays at its bound),
        `masked` of them drawn under a token mask (the mask var: mask_bucket; 1 by default, so
        a step without masks copies up one row of them, not the bound's)."""
        if groups < 1 or groups > self.groups_max:
            raise ProtocolError(f"program {self.program!r}: {groups} sequences is outside the var bound "
                                f"{self.groups_var or 'groups'} <= {self.groups_max}")
        if rows < 1 or rows > self.rows_max:
            raise ProtocolError(f"program {self.program!r}: {rows} rows is outside the var bound "
                                f"{self.rows_var or 'rows'} <= {self.rows_max}")
        out = {}
        if self.groups_var:
            out[self.groups_var] = groups
        if self.rows_var:
            out[self.rows_var] = rows
        if self.reach_var and reach is not None:
            out[self.reach_var] = self.reach_bucket(reach)
        if self.mask_var:
            out[self.mask_var] = self.mask_bucket(masked)
        elif masked:
            self.mask_bucket(masked)  # refused past the input's rows
        return out


@dataclass(frozen=True, slots=True)
class ServingProtocol:
    steppers: tuple[Stepper, ...]
    once: tuple[str, ...]
    paged_states: dict[str, int]  # paged state -> tokens per page
    max_positions: int | None = None  # positions a sequence may reach: the position inputs' domain
    slot_buffers: dict[str, str] | None = None  # a `slot` input -> the per-sequence state whose slots it holds
    # the program that verifies speculative rounds (an `accepted` output): kept apart from the
    # steppers, so that no plain step ever takes it (None: the manifest offers no rounds)
    verify: Stepper | None = None

    def for_rows(self, groups: int, rows_per_group: int | None) -> Stepper:
        """The program that steps `groups` sequences of rows_per_group rows each (None: ragged).

        A fixed-rows program that matches exactly is preferred (decode is groups x 1 row), the
        one of the fewest sequences among several (a small-batch decode beside a wide one)."""
        if rows_per_group is not None:
            fit = [s for s in self.steppers if s.rows == rows_per_group and groups <= s.groups_max]
            if fit:
                return min(fit, key=lambda s: s.groups_max)
        total = None if rows_per_group is None else groups * rows_per_group
        for s in self.steppers:
            if s.ragged and groups <= s.groups_max and (total is None or total <= s.rows_max):
                return s
        raise ProtocolError(f"no program steps {groups} sequences of {rows_per_group or 'ragged'} rows")

    def fixed(self, rows_per_group: int) -> list[Stepper]:
        """The fixed-rows programs of rows_per_group rows a sequence, fewest sequences first."""
        return sorted((s for s in self.steppers if s.rows == rows_per_group), key=lambda s: s.groups_max)

    @property
    def every(self) -> tuple[Stepper, ...]:
        """Every program that steps a batch, the verify program included."""
        return self.steppers + ((self.verify,) if self.verify else ())

    @property
    def max_chunk(self) -> int:
        return max((s.rows_max for s in self.steppers if s.ragged), default=1)


def derive(v: Verified) -> ServingProtocol:
    m = v.manifest
    env_max = dict(v.constants)
    for name, var in m.vars.items():
        env_max[name] = var.max
    steppers = []
    paged = {}
    for name, st in m.states.items():
        if st.bytes_per_token is not None:
            paged[name] = 0
    per_seq = [n for n, st in m.states.items() if st.bytes_per_seq is not None]
    slot_buffers: dict[str, str] = {}
    for pname, prog in m.programs.items():
        if prog.batch is None:
            continue
        touched: list[str] = []
        for call in prog.calls:
            for a in call.args:
                if isinstance(a, BufArg) and a.buf not in touched:
                    touched.append(a.buf)
        inputs, outputs, tables, slots = {}, {}, [], []
        for bname in touched:
            b = m.buffers[bname]
            if b.fill == "slot":
                state = _slot_state(bname, b, per_seq)
                if state in [x.state for x in slots]:
                    raise ProtocolError(f"program {pname!r} touches two slot inputs of state {state!r}: "
                                        f"{next(x.buffer for x in slots if x.state == state)!r} and {bname!r}")
                slots.append(SlotInput(bname, state))
                slot_buffers[bname] = state
            elif b.fill is not None:
                side = inputs if b.fill in INPUT_ROLES else outputs
                if b.fill in side:
                    raise ProtocolError(f"program {pname!r} touches two buffers of role {b.fill!r}: "
                                        f"{side[b.fill]!r} and {bname!r}")
                side[b.fill] = bname
            elif b.kind == "input" and b.domain is not None and b.domain.index_into:
                stride = evaluate(b.domain.stride, env_max)
                tables.append(PageTable(bname, b.domain.index_into, stride))
                paged[b.domain.index_into] = stride
        g, r = prog.batch.groups, prog.batch.rows
        gvar = g if isinstance(g, str) and g in m.vars else None
        rvar = r if isinstance(r, str) and r in m.vars else None
        fixed_rows = None if rvar else evaluate(r, env_max)
        reach = prog.batch.reach
        mask = m.buffers[inputs["mask"]].shape[0] if "mask" in inputs else None
        mask_var = mask if isinstance(mask, str) and mask in m.vars else None
        steppers.append(Stepper(
            program=pname, groups_var=gvar, groups_max=evaluate(g, env_max), rows=fixed_rows, rows_var=rvar,
            rows_max=evaluate(r, env_max) if rvar else evaluate(g, env_max) * fixed_rows,
            inputs=inputs, outputs=outputs, page_tables=tuple(tables), slots=tuple(slots),
            reach_var=reach, reach_max=env_max[reach] if reach else 0,
            keys_var=prog.batch.keys, keys_max=env_max[prog.batch.keys] if prog.batch.keys else 0,
            mask_var=mask_var, mask_max=evaluate(mask, env_max) if mask is not None else 0))
    once = tuple(n for n, p in m.programs.items() if p.once)
    verify = _verifier(steppers)
    steppers = [s for s in steppers if s is not verify]
    bounds = [evaluate(m.buffers[s.inputs["position"]].domain.range[1], env_max) for s in steppers
              if "position" in s.inputs and m.buffers[s.inputs["position"]].domain is not None
              and m.buffers[s.inputs["position"]].domain.range is not None]
    return ServingProtocol(tuple(steppers), once, paged, min(bounds) if bounds else None, slot_buffers, verify)


def prompt_keys(cu_seqlens, positions, prompt_len) -> int:
    """The prompt keys a step's rows attend over (a Batch.keys var's value): for each sequence
    with a prompt row (its rows are consecutive positions; a prompt row's is below its
    prompt_len), the positions up to its last prompt row, summed. Every prefill step counts it
    on the host: array operations, no loop over the sequences."""
    cu = np.asarray(cu_seqlens, np.int64)
    pos, plen = np.asarray(positions, np.int64), np.asarray(prompt_len, np.int64)
    first, end = cu[:-1], cu[1:]
    some = end > first
    first, last, plen = pos[first[some]], pos[end[some] - 1], plen[some]
    return int(np.where(first < plen, np.minimum(last + 1, plen), 0).sum())


# What a verify program reads and writes: each sequence's rows are its last token and the k
# tokens proposed after it (token, position, cu_seqlens), each row's own draw (temperature,
# rng), the target's token a row (tokens) and how many proposed tokens each sequence keeps
# (accepted: the longest prefix of its proposal equal to the target's tokens).
# role prompt_len where the rows are not a request's (a driver's, kern test's script's): every row
# a prompt token
PROMPT_ALL = (1 << 31) - 1
VERIFY_ROLES = ({"token", "position", "cu_seqlens", "temperature", "rng"}, {"tokens", "accepted"})


def _verifier(steppers: list[Stepper]) -> Stepper | None:
    found = [s for s in steppers if "accepted" in s.outputs]
    if not found:
        return None
    if len(found) > 1:
        raise ProtocolError(f"programs {found[0].program!r} and {found[1].program!r} both have an `accepted` output: "
                            "a manifest declares one verify program")
    return found[0]


def verify_problem(st: Stepper) -> str | None:
    """Why a verify program cannot run rounds (None: it can). Checked where rounds are asked
    for, not at derive: a pipeline stage's slice of it (kern cut) carries only some roles."""
    ins, outs = VERIFY_ROLES
    missing = sorted((ins - st.inputs.keys()) | (outs - st.outputs.keys()))
    if st.ragged and not missing:
        return None
    return (f"program {st.program!r} has an `accepted` output, so it verifies speculative rounds: it must be ragged "
            "(rows a var) with roles " + ", ".join(sorted(ins | outs)) +
            (f" (missing: {', '.join(missing)})" if missing else ""))


def _slot_state(name: str, b, per_seq: list[str]) -> str:
    """The per-sequence state a `slot` input indexes: its domain's index_into, or the one
    per-sequence state. A lease holds one slot of each per-sequence state, not at one index:
    with several, each slot input names its own."""
    if b.domain is not None and b.domain.index_into:
        return b.domain.index_into
    if len(per_seq) == 1:
        return per_seq[0]
    raise ProtocolError(f"buffers.{name}: a slot input must name its per-sequence state (domain.index_into) where "
                        f"the manifest declares {len(per_seq)} ({', '.join(per_seq) or 'none'})")
