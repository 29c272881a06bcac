"""The workloads kern test runs: A's bounds (speculative rounds only where both sides verify),
the wide decode's extra workload, and a growth round's."""

from __future__ import annotations

import dataclasses
from typing import Protocol

from ..drive import script
from ..drive.engine_io import EngineIO
from ..manifest.protocol import derive
from ..manifest.verify import Verified

class Options(Protocol):
    """What the workloads take of kern test's options (judge.Options)."""

    seed: int
    seqs: int
    decode_steps: int
    max_prompt: int | None
    chunk: int


def limits(io: EngineIO, opts: Options, candidate: Verified | None = None) -> script.Bounds:
    """A's bounds for the workload; speculative rounds only where the candidate also declares a
    verify program (else its rows would have no program to run in: they are A's alone)."""
    lim = io.limits()
    lim = dataclasses.replace(lim, chunk=min(lim.chunk, opts.chunk))
    if candidate is not None and derive(candidate).verify is None:
        lim = dataclasses.replace(lim, round_groups=0, round_rows=0)
    if candidate is not None:  # a step's prompt keys within both sides' bounds
        bounds = [k for k in [lim.keys] + [s.keys_max for s in derive(candidate).steppers if s.ragged and s.keys_var]
                  if k is not None]
        lim = dataclasses.replace(lim, keys=min(bounds) if bounds else None)
    return lim


def wide(v_a: Verified, v_b: Verified, lim: script.Bounds, opts: Options,
         text: tuple[int, ...] | None) -> script.Workload | None:
    """Decode steps of one sequence more than any decode program of A takes, when B has a
    program for them (a wide decode): short prompts of the text, each sequence in one page, three
    decode rows each (on SmolLM2-135M 29-53 of the 99 wide rows are decisive, seeds 0-3). None
    when B has no such program or the pages do not hold it."""
    most = max((s.groups_max for s in derive(v_a).fixed(1)), default=0)
    if not most or not any(s.groups_max > most for s in derive(v_b).fixed(1)):
        return None
    try:
        return script.make(opts.seed + 500, dataclasses.replace(lim, decode_groups=most + 1), seqs=most + 1,
                             decode_steps=3, max_prompt=max(1, lim.page_tokens - 3), corpus=text)
    except ValueError:
        return None


def grow(opts: Options, lim: script.Bounds, k: int, text: tuple[int, ...] | None) -> script.Workload:
    """Round k's workload: twice the sequences of the round before (as many as the pages hold),
    a fresh seed, the text's tokens when there is a tokenizer."""
    seqs = opts.seqs * 2 ** k
    while True:
        try:
            return script.make(opts.seed + 1000 * k, lim, seqs=seqs, decode_steps=opts.decode_steps,
                                 max_prompt=opts.max_prompt, corpus=text)
        except ValueError:
            if seqs <= 1:
                raise
            seqs //= 2
