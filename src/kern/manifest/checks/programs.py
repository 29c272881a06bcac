"""9. programs: no read before write; no writes to inputs or weights; every output written; at
least one program steps a batch; a stepping program has at most one buffer per serving role,
and each role buffer's first axis holds what the role counts for the program's batch."""

from __future__ import annotations

from collections.abc import Iterator

from ..context import Context
from ..expr import ExprError, evaluate
from ..schema import Add, BufArg, Mul
from ..problems import Problem

_NOT_WRITTEN_BY_CALLS = ("input", "weight", "pointers")  # the caller, the checkpoint, the runtime


def programs(c: Context) -> Iterator[Problem]:
    m = c.m
    if not m.programs:
        if not c.broken.has_section("programs"):
            yield Problem("programs", "no programs")
        return
    if not any(p.batch is not None for p in m.programs.values()) and not c.broken.has_section("programs"):
        yield Problem("programs", "no program steps a batch (give one a batch)")
    kind_of = {n: b.kind for n, b in m.buffers.items()}
    # what calls that did not parse may touch: never reported as read before written
    maybe = {n for n in kind_of if c.mentioned(n)}
    accesses = {pname: list(_accesses(c, pname)) for pname in m.programs}
    written_anywhere = maybe.union(*(unsure for acc in accesses.values() for *_, unsure in acc))
    written_anywhere.update(b for acc in accesses.values() for _, _, _, writes, _ in acc for b, _ in writes)
    for pname, prog in m.programs.items():
        if prog.once and prog.batch is not None:
            yield Problem(f"programs.{pname}", "a once program runs at load and steps no batch")
        if prog.batch is not None:
            for key in ("groups", "rows"):
                r = c.bounds(getattr(prog.batch, key), f"programs.{pname}.batch.{key}")
                if r is not None and r[0] < 1:
                    yield Problem(f"programs.{pname}.batch.{key}", f"must be >= 1 at the var minima, got {r[0]}")
            for key in ("reach", "keys"):
                var = getattr(prog.batch, key)
                if var is not None and var not in m.vars and c.missing("vars", var):
                    yield Problem(f"programs.{pname}.batch.{key}", f"names no var: {var!r} "
                                  f"(vars: {', '.join(m.vars) or 'none'})")
            if prog.batch.keys is not None:
                fills = {c.m.buffers[a.buf].fill for call in prog.calls for a in call.args
                         if isinstance(a, BufArg) and a.buf in c.m.buffers}
                missing = [r for r in ("cu_seqlens", "position", "prompt_len") if r not in fills]
                if missing:
                    yield Problem(f"programs.{pname}.batch.keys", "counts each sequence's prompt keys from its rows: "
                                  f"the program needs inputs of roles cu_seqlens, position and prompt_len "
                                  f"(missing: {', '.join(missing)})")
            yield from _roles(c, pname, accesses[pname])
            yield from _role_axes(c, pname, accesses[pname])
        ready = {n for n, k in kind_of.items() if k in ("input", "weight", "pointers", "peer")}
        if c.broken.calls_of(pname):
            ready |= maybe
        calls = prog.calls
        for ci, touched, reads, writes, unsure in accesses[pname]:
            ready |= unsure
            for r in reads:
                if r in ready:
                    continue
                kind = kind_of[r]
                where = f"programs.{pname}.calls[{ci}] (op {calls[ci].op})"
                if kind == "carry":
                    if r not in written_anywhere:
                        yield Problem(where, f"reads carry buffer {r!r}, which no program writes")
                    continue
                yield Problem(where, f"reads {kind} buffer {r!r} before anything in program {pname!r} writes it")
                ready.add(r)  # report once
            for bname, i in writes:
                kind = kind_of[bname]
                if kind in _NOT_WRITTEN_BY_CALLS:
                    yield Problem(f"programs.{pname}.calls[{ci}] (op {calls[ci].op}) arg {i}",
                                  f"writes to {kind} buffer {bname!r}")
                ready.add(bname)
    for name, kind in kind_of.items():
        if kind == "output" and name not in written_anywhere:
            yield Problem(f"buffers.{name}", "output buffer is never written by any program")


def _roles(c: Context, pname: str, accesses) -> Iterator[Problem]:
    """A stepping program touches at most one buffer per serving role (a slot input per
    per-sequence state it names)."""
    fill_of = {n: b.fill if b.fill != "slot" or b.domain is None or not b.domain.index_into
               else f"slot of {b.domain.index_into}" for n, b in c.m.buffers.items() if b.fill is not None}
    holder: dict[str, str] = {}
    for ci, touched, *_ in accesses:
        for bname in touched:
            role = fill_of.get(bname)
            if role is None:
                continue
            if holder.setdefault(role, bname) != bname:
                op = c.m.programs[pname].calls[ci].op
                yield Problem(f"programs.{pname}.calls[{ci}] (op {op})", f"touches buffer {bname!r} of role "
                              f"{role!r}, but program {pname!r} already has {holder[role]!r} in that role")
                holder[role] = bname  # report each extra holder once


# What the first axis of a role buffer counts: the batch's groups, its rows in all (groups x rows
# when rows is fixed; the rows var when ragged), or groups + 1 (offsets). A verify program draws
# a token a row (temperature, rng and tokens by rows) and keeps an accepted count a group. A
# `mask` holds the step's masked rows' bitmasks, as many as its own var says (no batch count).
_ROLE_AXIS = {"token": ("rows",), "position": ("rows",), "cu_seqlens": ("groups + 1",), "slot": ("groups",),
              "seq_len": ("groups",), "temperature": ("groups", "rows"), "rng": ("groups", "rows"),
              "mask": (), "mask_row": ("groups", "rows"), "prompt_len": ("groups",),
              "tokens": ("groups", "rows"), "logits": ("groups", "rows"), "accepted": ("groups",)}


def _role_axes(c: Context, pname: str, accesses) -> Iterator[Problem]:
    batch = c.m.programs[pname].batch
    g, r = batch.groups, batch.rows
    ragged = isinstance(r, str) and r in c.m.vars
    counts = {"groups": g, "rows": r if ragged else Mul(mul=[g, r]), "groups + 1": Add(add=[g, 1])}
    seen: set[str] = set()
    for _, touched, *_ in accesses:
        for bname in touched:
            b = c.m.buffers[bname]
            if b.fill is None or bname in seen:
                continue
            seen.add(bname)
            wants = _ROLE_AXIS[b.fill]
            if not wants:
                continue
            if not b.shape:
                yield Problem(f"buffers.{bname}.shape", f"role {b.fill!r} needs a first axis of {wants[0]}")
                continue
            try:
                got = [evaluate(b.shape[0], env) for env in (c.at_min, c.at_max)]
                fits = any(got == [evaluate(counts[w], env) for env in (c.at_min, c.at_max)] for w in wants)
            except ExprError:
                continue  # reported where the expression stands
            if not fits:
                yield Problem(f"buffers.{bname}.shape[0]",
                              f"holds role {b.fill!r} for program {pname!r}, which steps {_expr(g)} groups of "
                              f"{_expr(r)} rows: must be {' or '.join(wants)} ({got[0]} to {got[1]} at the var "
                              "bounds)")


def _expr(e) -> str:
    return str(e) if isinstance(e, (int, str)) else "an expression"


def _accesses(c: Context, pname: str):
    """(call index, buffers touched, buffers read, (buffer, arg index) written, buffers unsure) per
    call, in order. A call that cannot be judged (its op or its arguments do not resolve) leaves
    every buffer it passes unsure: it may write them, so none is later "read before written"."""
    buffers = c.m.buffers
    for ci, call in enumerate(c.m.programs[pname].calls):
        params = c.params.get(call.op)
        if params is None or len(params) != len(call.args):
            yield ci, [], [], [], {a.buf for a in call.args if type(a) is BufArg and a.buf in buffers}
            continue
        touched, reads, writes = [], [], []
        for ai, (p, a) in enumerate(zip(params, call.args)):
            if p.kind == "buffer" and type(a) is BufArg and a.buf in buffers:
                touched.append(a.buf)
                if p.direction != "out":
                    reads.append(a.buf)
                if p.direction != "in":
                    writes.append((a.buf, ai))
        yield ci, touched, reads, writes, set()
