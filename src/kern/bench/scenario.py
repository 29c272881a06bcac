"""A scenario: one workload shape made real. Its sequences first get their context from the
model's own prefill (the ragged program, in chunks), then the measured step runs on it.

`plan` is pure (from the protocol and the manifest's limits): a Scenario, or why the shape is
dropped. `prepare` runs the prefix on an engine and returns the measured step's vars and inputs."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..drive.script import Chunk, Bounds, Seq, ScriptStep, feed, pack
from ..manifest.expr import evaluate
from ..manifest.protocol import ServingProtocol, ProtocolError, Stepper, verify_problem
from ..manifest.verify import Verified
from ..runtime.engine import Engine
from .workload import Shape


@dataclass(frozen=True, slots=True)
class Scenario:
    shape: Shape
    stepper: Stepper
    seqs: tuple[Seq, ...]
    prefix: tuple[ScriptStep, ...]  # the steps that build the context
    measured: ScriptStep

    @property
    def program(self) -> str:
        return self.stepper.program


def _ragged(protocol: ServingProtocol) -> Stepper | None:
    return next((s for s in protocol.steppers if s.ragged), None)


def fitted(shape: Shape, protocol: ServingProtocol) -> Shape:
    """A traced shape whose rounded-up rows pass the prefill program's rows takes the most that
    program steps for its sequences (the step that ran fitted it; a shape written in a workload
    file is left as written, and dropped if no program takes it)."""
    pre = _ragged(protocol)
    if (shape.traced and not shape.round and pre is not None and 1 < shape.rows
            and shape.groups <= pre.groups_max and shape.groups * shape.rows > pre.rows_max):
        return replace(shape, rows=max(1, pre.rows_max // shape.groups))
    return shape


def _stepper(protocol: ServingProtocol, shape: Shape) -> Stepper:
    """The program that steps a shape: a round's is the verify program (its rows ragged, the
    groups' rows laid end to end), any other's the one for_rows picks."""
    if not shape.round:
        return protocol.for_rows(shape.groups, shape.rows)
    st = protocol.verify
    if st is None:
        raise ProtocolError("a speculative round (round = true) needs a verify program; this manifest has none")
    if (why := verify_problem(st)) is not None:
        raise ProtocolError(why)
    if shape.groups > st.groups_max or shape.groups * shape.rows > st.rows_max:
        raise ProtocolError(f"program {st.program!r}: a round of {shape.groups} sequences of {shape.rows} rows is "
                            f"outside its bounds ({st.groups_max} sequences, {st.rows_max} rows)")
    return st


def state_budget(v: Verified, protocol: ServingProtocol, shapes: tuple[Shape, ...]) -> int:
    """Bytes each state needs to hold the largest shape of the workload (every sequence of it
    at its context plus its rows), over the shapes a program accepts and a page table can
    address; 0 when none needs any. The engine gives every state this budget."""
    m, consts = v.manifest, v.constants
    top = {**consts, **{n: var.max for n, var in m.vars.items()}}
    width = min((evaluate(m.buffers[pt.buffer].shape[-1], top) for st in protocol.steppers for pt in st.page_tables),
                default=None)
    need = 0
    for sh in (fitted(sh, protocol) for sh in shapes):
        try:
            _stepper(protocol, sh)
        except ProtocolError:
            continue
        for name, st in m.states.items():
            if st.bytes_per_token is not None:
                tokens = max(protocol.paged_states.get(name, 1), 1)
                pages = -(-(sh.context + sh.rows) // tokens)
                if width is None or pages <= width:
                    need = max(need, evaluate(st.bytes_per_token, consts) * tokens * pages * sh.groups)
            elif st.bytes_per_seq is not None:
                need = max(need, evaluate(st.bytes_per_seq, consts) * sh.groups)
    return need


def plan(shape: Shape, protocol: ServingProtocol, lim: Bounds, seed: int) -> Scenario | str:
    """The scenario for a shape, or the reason no program of this manifest accepts it."""
    shape = fitted(shape, protocol)
    pre = _ragged(protocol)
    g, r, c = shape.groups, shape.rows, shape.context
    try:
        st = _stepper(protocol, shape)
    except ProtocolError as exc:
        return str(exc)
    if c + r > lim.context:
        return f"context {c} + {r} rows passes the {lim.context} positions the manifest allows"
    if c and pre is None:
        return "no ragged (prefill) program to build the context with"
    pages_each = -(-(c + r) // lim.page_tokens)
    if pages_each > lim.table_width:
        return f"a sequence needs {pages_each} pages, a page table holds {lim.table_width}"
    if g * pages_each > lim.pages:
        return f"{g} sequences need {g * pages_each} pages, the paged state holds {lim.pages} (--memory)"
    rng = np.random.Generator(np.random.PCG64([seed, g, r, c]))
    lo, hi = lim.vocab
    seqs = tuple(Seq(tuple(int(x) for x in rng.integers(lo, hi, c + r)), (), tuple(range(i * pages_each,
                                                                                         (i + 1) * pages_each)),
                     "bench") for i in range(g))
    prefix: list[ScriptStep] = []
    if st.ragged and st.keys_var and g * (c + r) > st.keys_max:
        return (f"{g} sequences at context {c} + {r} rows attend over {g * (c + r)} prompt keys a step, past the "
                f"program's bound {st.keys_var} <= {st.keys_max}")
    if c:
        done = [0] * g
        bounds = replace(lim, chunk=pre.rows_max, ragged_groups=pre.groups_max,
                         keys=pre.keys_max if pre.keys_var else None)
        while any(d < c for d in done):
            prefix.append(ScriptStep(True, tuple(pack([(i, done[i], c) for i in range(g)], bounds,
                                                      lambda i, at, k: seqs[i].prompt[at:at + k], done))))
    measured = ScriptStep(st.ragged, tuple(Chunk(i, c, seqs[i].prompt[c:c + r]) for i in range(g)), shape.round)
    return Scenario(shape, st, seqs, tuple(prefix), measured)


def widths(engine: Engine) -> dict[str, int]:
    return {pt.buffer: engine.shapes[pt.buffer][-1] for st in engine.protocol.every for pt in st.page_tables}


def prepare(engine: Engine, sc: Scenario) -> tuple[dict[str, int], dict[str, np.ndarray]]:
    """Build the context with the prefill program; the measured step's (vars, inputs)."""
    w = widths(engine)
    for step in sc.prefix:
        st = engine.protocol.for_rows(len(step.chunks), None)
        vars, ins = feed(step, st, sc.seqs, w)
        engine.run(st.program, vars, ins)
    engine.device.synchronize()
    return feed(sc.measured, sc.stepper, sc.seqs, w)
