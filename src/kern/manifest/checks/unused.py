"""10. nothing declared and unused: every buffer and state is passed by a call (or named by
another buffer), every op is called, every var and constant is named by an expression. A name
mentioned inside an entry that did not parse counts as used: that entry may well use it."""

from __future__ import annotations

from collections.abc import Iterator

from ..context import Context
from ..expr import names
from ..schema import BufArg, StateArg, ValueArg
from ..problems import Problem


def unused(c: Context) -> Iterator[Problem]:
    m = c.m
    used_bufs: set[str] = set()
    used_states: set[str] = set()
    used_ops: set[str] = set()
    exprs: list = []
    for _, call in c.calls():
        used_ops.add(call.op)
        for a in call.args:
            if isinstance(a, BufArg):
                used_bufs.add(a.buf)
                if a.offset is not None:
                    exprs.append(a.offset)
                exprs.extend(a.shape or ())
            elif isinstance(a, StateArg):
                used_states.add(a.state)
            elif not isinstance(a.value, float):
                exprs.append(a.value)
    for b in m.buffers.values():
        used_bufs.update(b.entries or [])
        used_states.update(b.entries or [])
        if b.of:
            used_bufs.add(b.of)
        exprs.extend(b.shape)
        if b.domain is not None:
            exprs.extend(e for e in (*(b.domain.range or ()), b.domain.stride) if e is not None)
            if b.domain.index_into:
                used_states.add(b.domain.index_into)
    for s in m.states.values():
        exprs.extend(e for e in (s.bytes_per_token, s.bytes_per_seq, s.bytes) if e is not None)
    for op in m.ops.values():
        for l in op.impl.launches:
            exprs.extend((*l.grid, *l.block, l.shared_mem))
            exprs.extend(a.value for a in l.args or () if isinstance(a, ValueArg) and not isinstance(a.value, float))
    for p in m.programs.values():
        if p.batch is not None:
            exprs.extend((p.batch.groups, p.batch.rows))
            exprs.extend(v for v in (p.batch.reach, p.batch.keys) if v is not None)
    exprs.extend(m.constants.values())
    used_names = {e for e in exprs if type(e) is str}
    used_names.update(n for e in exprs if type(e) is not str and type(e) is not int for n in names(e))
    for kind, declared, used in (("buffers", m.buffers, used_bufs), ("states", m.states, used_states),
                                 ("ops", m.ops, used_ops), ("vars", m.vars, used_names),
                                 ("constants", m.constants, used_names)):
        how = {"ops": "no call invokes it", "vars": "no expression names it",
               "constants": "no expression names it"}.get(kind, "no call passes it")
        for n in declared:
            if n not in used and not c.mentioned(n):
                yield Problem(f"{kind}.{n}", f"declared and unused ({how})")
