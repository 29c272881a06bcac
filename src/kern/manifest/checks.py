"""The verifier's checks: pure functions over the manifest that yield problems.

Numbered as in DESIGN.md ("What kern verify checks"). Each names its place. Expressions are
bounded by interval arithmetic over the var ranges [1, max] (expr.interval): "at the var
minima" is the least value an expression can take, "at the var maxima" the greatest."""

from __future__ import annotations

import re
from collections.abc import Iterator
from math import prod

from .context import Context
from .expr import ExprError, evaluate, names
from .limits import CUDA, EXTERNS, INT32_MAX, MAX_BYTES
from .model import DTYPE_BYTES, INPUT_ROLES, BufArg, Launch, StateArg, ValueArg
from .problems import Problem
from .types import SCALARS, Param

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_HF = re.compile(r"^hf:[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+/[^@\s]+(@[A-Za-z0-9_.-]+)?$")
_ARCH = re.compile(r"^sm_[0-9]+[a-z]?$")
_ROLE_DTYPES = {"token": ("i32",), "position": ("i32",), "slot": ("i32",), "seq_len": ("i32",),
                "cu_seqlens": ("i32",), "tokens": ("i32",), "logits": ("f32", "bf16", "f16")}
_INTEGER = ("i32", "u32", "i64", "u64", "i8", "u8")
_GEOMETRY = ("grid", "block", "shared_mem", "cooperative", "pdl")
_NOT_WRITTEN_BY_CALLS = ("input", "weight", "pointers")  # the caller, the checkpoint, the runtime


# 1. schema: what pydantic cannot see ---------------------------------------------------------
def schema(c: Context) -> Iterator[Problem]:
    t = c.m.target
    if t.device == "cuda" and (t.arch is None or not _ARCH.match(t.arch)):
        yield Problem("target.arch", f"a cuda target names its architecture like sm_90a, got {t.arch!r}")
    if t.device == "cpu" and t.arch is not None:
        yield Problem("target.arch", "a cpu target has no arch")
    for name in c.m.states:
        if name in c.m.buffers:
            yield Problem(f"states.{name}", f"duplicate name {name!r}: a buffer has the same name")


# 2. vars and constants -------------------------------------------------------------------
def vars_and_constants(c: Context) -> Iterator[Problem]:
    for name, var in c.m.vars.items():
        if var.max < 1:
            yield Problem(f"vars.{name}.max", f"must be >= 1, got {var.max}")
        if name in c.m.constants:
            yield Problem(f"vars.{name}", "a constant has the same name")


# 3. buffers --------------------------------------------------------------------------------
def buffers(c: Context) -> Iterator[Problem]:
    m = c.m
    for name, b in m.buffers.items():
        where = f"buffers.{name}"
        his: list[int] = []
        for i, d in enumerate(b.shape):
            r = c.bounds(d, f"{where}.shape[{i}]")
            if r is None:
                continue
            if r[0] < 1:
                yield Problem(f"{where}.shape[{i}]", f"must be >= 1 at the var minima, got {r[0]}")
            his.append(r[1])
        if len(his) == len(b.shape):
            elems = prod(his)
            nbytes = elems * DTYPE_BYTES[b.dtype]
            if nbytes > MAX_BYTES:
                yield Problem(where, f"{nbytes} bytes at the var maxima overflows a 64-bit size")
            elif m.target.device == "cuda" and elems > INT32_MAX:
                yield Problem(where, f"{elems} elements at the var maxima overflow 32-bit indexing")
        if b.fill is not None:
            want_kind = "input" if b.fill in INPUT_ROLES else "output"
            if b.kind != want_kind:
                yield Problem(f"{where}.fill", f"role {b.fill!r} belongs on an {want_kind} buffer, not {b.kind}")
            if b.dtype not in _ROLE_DTYPES[b.fill]:
                yield Problem(f"{where}.fill", f"role {b.fill!r} needs dtype {' or '.join(_ROLE_DTYPES[b.fill])}, "
                              f"got {b.dtype}")
        if b.domain is not None:
            yield from _domain(c, where, b)
        if b.kind == "weight" and not b.bind:
            yield Problem(where, "a weight buffer needs bind (the checkpoint tensors it holds)")
        if b.bind and b.kind != "weight":
            yield Problem(f"{where}.bind", f"only weight buffers bind checkpoint tensors, this is {b.kind}")
        for i, seg in enumerate(b.bind or []):
            for axis in ("rows", "cols"):
                rng = getattr(seg, axis)
                if rng is not None and not (0 <= rng[0] < rng[1]):
                    yield Problem(f"{where}.bind[{i}].{axis}", f"range must satisfy 0 <= lo < hi, got {list(rng)}")
        yield from _peer_and_pointers(c, where, b)


def _domain(c: Context, where: str, b) -> Iterator[Problem]:
    d = b.domain
    if b.dtype not in _INTEGER:
        yield Problem(f"{where}.domain", f"a domain bounds integer values, the buffer is {b.dtype}")
    if b.kind != "input":
        yield Problem(f"{where}.domain", f"a domain bounds what the caller writes, on input buffers; this is {b.kind}")
    if d.range is not None:
        lo = c.bounds(d.range[0], f"{where}.domain.range[0]")
        hi = c.bounds(d.range[1], f"{where}.domain.range[1]")
        if lo is not None and hi is not None and lo[1] >= hi[0]:
            yield Problem(f"{where}.domain.range", f"can be empty: [{lo[1]}, {hi[0]}) at the var bounds")
    if d.index_into is not None:
        st = c.m.states.get(d.index_into)
        if st is None:
            yield Problem(f"{where}.domain.index_into", f"no state named {d.index_into!r}")
        elif st.bytes_per_token is None:
            yield Problem(f"{where}.domain.index_into", f"state {d.index_into!r} is not paged (no bytes_per_token)")
        if d.range is not None:
            yield Problem(f"{where}.domain", "give range or index_into, not both")
        if d.stride is None:
            yield Problem(f"{where}.domain", "index_into needs stride (tokens per page)")
        else:
            s = c.bounds(d.stride, f"{where}.domain.stride")
            if s is not None and s[0] < 1:
                yield Problem(f"{where}.domain.stride", f"must be >= 1, got {s[0]}")
    elif d.stride is not None:
        yield Problem(f"{where}.domain.stride", "stride only goes with index_into")
    if d.range is None and d.index_into is None:
        yield Problem(f"{where}.domain", "a domain gives range or index_into")


def _peer_and_pointers(c: Context, where: str, b) -> Iterator[Problem]:
    m = c.m
    if b.kind == "peer":
        if b.of is None:
            yield Problem(where, "a peer buffer names the exported buffer it mirrors (of)")
        elif b.of not in m.buffers:
            yield Problem(f"{where}.of", f"no buffer named {b.of!r}")
        elif m.buffers[b.of].kind in ("peer", "pointers", "input", "weight"):
            yield Problem(f"{where}.of", f"buffer {b.of!r} is {m.buffers[b.of].kind}; only device memory that "
                          "calls write (workspace, carry, output) is exported")
        if m.topology.ranks < 2:
            yield Problem(where, "peer buffers need a topology of 2 or more ranks")
    elif b.of is not None:
        yield Problem(f"{where}.of", f"only peer buffers have of, this is {b.kind}")
    if b.kind == "pointers":
        if not b.entries:
            yield Problem(where, "a pointers buffer lists the buffers whose addresses it holds (entries)")
        for i, e in enumerate(b.entries or []):
            if e not in m.buffers and e not in m.states:
                yield Problem(f"{where}.entries[{i}]", f"no buffer or state named {e!r}")
        if b.dtype != "u64":
            yield Problem(f"{where}.dtype", f"a pointers buffer holds u64 addresses, got {b.dtype}")
    elif b.entries is not None:
        yield Problem(f"{where}.entries", f"only pointers buffers have entries, this is {b.kind}")


# 4. states ---------------------------------------------------------------------------------
def states(c: Context) -> Iterator[Problem]:
    for name, s in c.m.states.items():
        given = [k for k in ("bytes_per_token", "bytes_per_seq", "bytes") if getattr(s, k) is not None]
        if len(given) != 1:
            yield Problem(f"states.{name}", "declare exactly one of bytes_per_token, bytes_per_seq, bytes"
                          + (f"; got {', '.join(given)}" if given else ""))
        for k in given:
            r = c.bounds(getattr(s, k), f"states.{name}.{k}")
            if r is None:
                continue
            if r[0] < 1:
                yield Problem(f"states.{name}.{k}", f"must be >= 1 at the var minima, got {r[0]}")
            if r[1] > MAX_BYTES:
                yield Problem(f"states.{name}.{k}", f"{r[1]} bytes at the var maxima overflows a 64-bit size")


# 5. modules --------------------------------------------------------------------------------
def modules(c: Context) -> Iterator[Problem]:
    used = {l.module for op in c.m.ops.values() for l in op.impl.launches}
    for name, mod in c.m.modules.items():
        where = f"modules.{name}"
        if not _HEX64.match(mod.sha256):
            yield Problem(f"{where}.sha256", f"expected 64 lowercase hex digits, got {mod.sha256!r}")
        src = mod.source
        if src.startswith("hf:"):
            if not _HF.match(src):
                yield Problem(f"{where}.source", f"malformed hf source {src!r}: expected hf:org/repo/path[@rev]")
        elif "://" in src:
            if not src.startswith("https://") or len(src) <= len("https://"):
                yield Problem(f"{where}.source", f"only https:// URLs are fetched, got {src!r}")
        elif not src or src.startswith("/") or "\\" in src or ".." in src.split("/"):
            yield Problem(f"{where}.source",
                          f"a path must be relative to the manifest and stay inside its folder, got {src!r}")
        if name not in used:
            yield Problem(where, "declared and unused (no launch names it)")


# 6 + 7. launches and op dataflow -----------------------------------------------------------
def ops(c: Context) -> Iterator[Problem]:
    cuda = c.m.target.device == "cuda"
    for oname, op in c.m.ops.items():
        params = c.params.get(oname)
        if params is None:
            continue
        by_name = {p.name: p for p in params}
        scalars = {p.name: _full_range(p) for p in params if p.kind == "scalar"}
        written: set[str] = set()
        for li, launch in enumerate(op.impl.launches):
            where = f"ops.{oname}.impl.launches[{li}]"
            ext = launch.entry.removeprefix("extern:") if launch.entry.startswith("extern:") else None
            if ext is None:
                if launch.module is None:
                    yield Problem(where, f"entry {launch.entry!r} needs a module")
                elif launch.module not in c.m.modules:
                    yield Problem(f"{where}.module", f"no module named {launch.module!r}")
                if not _uses_params(launch, scalars):
                    yield from _geometry(c, where + ".", launch, None)
            else:
                if launch.module is not None:
                    yield Problem(f"{where}.module", "extern entries are library calls and name no module")
                if ext not in EXTERNS:
                    yield Problem(f"{where}.entry", f"unknown extern {ext!r}; known: {', '.join(sorted(EXTERNS))}")
                for key in sorted(launch.model_fields_set & set(_GEOMETRY)):
                    yield Problem(f"{where}.{key}", "extern entries are library calls and have no geometry")
            for key in ("cooperative", "pdl"):
                if getattr(launch, key) and not cuda:
                    yield Problem(f"{where}.{key}", f"{key} launches need a cuda target")
            args = launch.args if launch.args is not None else [p.name for p in params]
            passed: list[Param | None] = []
            for ai, a in enumerate(args):
                if isinstance(a, str):
                    if a not in by_name:
                        yield Problem(f"{where}.args[{ai}]", f"no param named {a!r}")
                    passed.append(by_name.get(a))
                else:
                    passed.append(None)
                    if not isinstance(a.value, float):
                        c.bounds(a.value, f"{where}.args[{ai}]", scalars)
            if ext in EXTERNS:
                kinds, ext_writes = EXTERNS[ext]
                if len(args) != len(kinds):
                    yield Problem(f"{where}.args", f"extern {ext} takes {len(kinds)} args, got {len(args)}")
                else:
                    for ai, (want, p) in enumerate(zip(kinds, passed)):
                        got = p.kind if p is not None else "scalar"
                        if got != want:
                            yield Problem(f"{where}.args[{ai}]", f"extern {ext} expects a {want} here, got {got}")
                default_writes = [args[i] for i in ext_writes if i < len(args) and isinstance(args[i], str)]
            else:
                default_writes = [p.name for p in passed if p is not None and p.writes]
            writes = launch.writes if launch.writes is not None else default_writes
            for w in writes:
                p = by_name.get(w)
                if p is None:
                    yield Problem(f"{where}.writes", f"no param named {w!r}")
                elif not p.writes:
                    yield Problem(f"{where}.writes", f"writes through param {w!r}, declared {p}")
                elif w not in args:
                    yield Problem(f"{where}.writes", f"writes param {w!r} but is not passed it")
                written.add(w)
        for i, p in enumerate(params):
            if p.direction == "out" and p.name not in written:
                yield Problem(f"ops.{oname}.params[{i}]", f"out param {p.name!r} is never written by a launch")


def _full_range(p: Param) -> tuple[int, int]:
    """The widest range a scalar param can take (f32 scalars do not size anything)."""
    return SCALARS[p.dtype] or (0, 0)


def _uses_params(launch: Launch, scalars: dict) -> bool:
    """Whether the launch's geometry depends on the op's scalar params (checked per call)."""
    if not scalars:
        return False
    return any(n in scalars for e in (*launch.grid, *launch.block, launch.shared_mem) for n in names(e))


def _geometry(c: Context, where: str, launch: Launch, scalars: dict | None) -> Iterator[Problem]:
    """Grid and block fit the device at the var maxima and are non-zero at the minima; shared
    memory fits. `where` ends in "." (op level) or " " (call level, with the call's scalars)."""
    cuda = c.m.target.device == "cuda"
    for key in ("grid", "block"):
        dims = getattr(launch, key)
        if not 1 <= len(dims) <= 3:
            yield Problem(f"{where}{key}", f"needs 1 to 3 dimensions, got {len(dims)}")
            continue
        his: list[int] | None = []
        for i, d in enumerate(dims):
            r = c.bounds(d, f"{where}{key}[{i}]", scalars)
            if r is None:
                his = None
                continue
            if r[0] < 1:
                yield Problem(f"{where}{key}[{i}]", f"is {r[0]} at the var minima; must be >= 1")
            if his is not None:
                his.append(r[1])
            if cuda and r[1] > CUDA[key][i]:
                at = "" if r[0] == r[1] else " at the var maxima"
                yield Problem(f"{where}{key}[{i}]", f"is {r[1]}{at}; the device allows {CUDA[key][i]}")
        if cuda and key == "block" and his and prod(his) > CUDA["threads"]:
            yield Problem(f"{where}block", f"{prod(his)} threads per block; the device allows {CUDA['threads']}")
    r = c.bounds(launch.shared_mem, f"{where}shared_mem", scalars)
    if r is not None and r[0] < 0:
        yield Problem(f"{where}shared_mem", f"is {r[0]} at the var minima; must be >= 0")
    if r is not None and cuda and r[1] > CUDA["shared_mem"]:
        yield Problem(f"{where}shared_mem", f"{r[1]} bytes at the var maxima; the device allows {CUDA['shared_mem']}")


# 8. calls ----------------------------------------------------------------------------------
def calls(c: Context) -> Iterator[Problem]:
    m = c.m
    cuda = m.target.device == "cuda"
    buffers, states, ranges = m.buffers, m.states, c.ranges
    per_call_geometry = {
        oname: [(li, l) for li, l in enumerate(op.impl.launches)
                if not l.entry.startswith("extern:")
                and _uses_params(l, {p.name for p in c.params[oname] if p.kind == "scalar"})]
        for oname, op in m.ops.items() if oname in c.params}
    for where, call in m.calls():
        params = c.params.get(call.op)
        if params is None:
            if call.op not in m.ops:
                yield Problem(where, f"no op named {call.op!r}")
            continue
        if len(call.args) != len(params):
            yield Problem(where, f"op takes {len(params)} args ({', '.join(p.name for p in params)}), "
                          f"got {len(call.args)}")
            continue
        scalars: dict[str, tuple[int, int]] = {}
        for i, (p, a) in enumerate(zip(params, call.args)):
            # The hot path formats no place: `where` and the arg index are joined only for a problem.
            kind = p.kind
            if kind == "buffer":
                if type(a) is not BufArg:
                    yield Problem(f"{where} arg {i}", f"expects {p}, got {_argdesc(a)}")
                    continue
                b = buffers.get(a.buf)
                if b is None:
                    yield Problem(f"{where} arg {i}", f"no buffer named {a.buf!r}")
                    continue
                if b.dtype != p.dtype:
                    yield Problem(f"{where} arg {i}", f"expects {p}, got buffer {a.buf!r} of {b.dtype}")
                if a.offset is not None or a.shape is not None:
                    yield from _view(c, f"{where} arg {i}", a, b, cuda)
            elif kind == "state":
                if type(a) is not StateArg:
                    yield Problem(f"{where} arg {i}", f"expects {p}, got {_argdesc(a)}")
                elif a.state not in states:
                    yield Problem(f"{where} arg {i}", f"no state named {a.state!r}")
            else:
                if type(a) is not ValueArg:
                    yield Problem(f"{where} arg {i}", f"expects {p}, got {_argdesc(a)}")
                    continue
                v = a.value
                if isinstance(v, float):
                    if p.dtype != "f32":
                        yield Problem(f"{where} arg {i}", f"expects an integer {p.dtype}, got {v!r}")
                    continue
                r = ranges.get(v) if type(v) is str else None
                if r is None:
                    r = c.bounds(v, f"{where} arg {i}")
                if r is None or p.dtype == "f32":
                    continue
                lo, hi = SCALARS[p.dtype]
                if not lo <= r[0] <= hi:
                    yield Problem(f"{where} arg {i}", f"value {r[0]} at the var minima does not fit {p.dtype}")
                if not lo <= r[1] <= hi:
                    yield Problem(f"{where} arg {i}", f"value {r[1]} at the var maxima does not fit {p.dtype}")
                scalars[p.name] = r
        for li, launch in per_call_geometry.get(call.op, ()):
            if all(n in scalars for e in (*launch.grid, *launch.block, launch.shared_mem) for n in names(e)
                   if n in {p.name for p in params}):
                yield from _geometry(c, f"{where} launch {li} ", launch, scalars)


def _argdesc(a) -> str:
    if isinstance(a, BufArg):
        return f"buffer {a.buf!r}"
    if isinstance(a, StateArg):
        return f"state {a.state!r}"
    return f"value {a.value!r}"


def _view(c: Context, w: str, a: BufArg, b, cuda: bool) -> Iterator[Problem]:
    """A view [offset, offset + size) lies inside the buffer with every var at 1 and at its max."""
    for env, at in ((c.at_max, "maxima"), (c.at_min, "minima")):
        try:
            total = prod(evaluate(d, env) for d in b.shape)
            off = evaluate(a.offset, env) if a.offset is not None else 0
            size = prod(evaluate(d, env) for d in a.shape) if a.shape is not None else total - off
        except ExprError as exc:
            yield Problem(w, f"view does not resolve: {exc}")
            return
        if off < 0 or size < 0 or off + size > total:
            yield Problem(w, f"view [{off}, {off + size}) of buffer {a.buf!r} is outside its {total} elements "
                          f"at the var {at}")
            return
        if cuda and (off * DTYPE_BYTES[b.dtype]) % 16:
            yield Problem(w, f"offset {off} of buffer {a.buf!r} is not 16-byte aligned")
            return


# 9. programs -------------------------------------------------------------------------------
def programs(c: Context) -> Iterator[Problem]:
    m = c.m
    if not m.programs:
        yield Problem("programs", "no programs")
        return
    if not any(p.batch is not None for p in m.programs.values()):
        yield Problem("programs", "no program steps a batch (give one a batch)")
    kind_of = {n: b.kind for n, b in m.buffers.items()}
    accesses = {pname: list(_accesses(c, pname)) for pname in m.programs}
    written_anywhere = {b for acc in accesses.values() for _, _, _, writes in acc for b, _ in writes}
    for pname, prog in m.programs.items():
        if prog.once and prog.batch is not None:
            yield Problem(f"programs.{pname}", "a once program runs at load and steps no batch")
        if prog.batch is not None:
            for key in ("groups", "rows"):
                r = c.bounds(getattr(prog.batch, key), f"programs.{pname}.batch.{key}")
                if r is not None and r[0] < 1:
                    yield Problem(f"programs.{pname}.batch.{key}", f"must be >= 1 at the var minima, got {r[0]}")
            if prog.batch.reach is not None and prog.batch.reach not in m.vars:
                yield Problem(f"programs.{pname}.batch.reach", f"names no var: {prog.batch.reach!r} "
                              f"(vars: {', '.join(m.vars) or 'none'})")
            yield from _roles(c, pname, accesses[pname])
        ready = {n for n, k in kind_of.items() if k in ("input", "weight", "pointers", "peer")}
        calls = prog.calls
        for ci, touched, reads, writes in accesses[pname]:
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
    """A stepping program touches at most one buffer per serving role."""
    fill_of = {n: b.fill for n, b in c.m.buffers.items() if b.fill is not None}
    holder: dict[str, str] = {}
    for ci, touched, _, _ in accesses:
        for bname in touched:
            role = fill_of.get(bname)
            if role is None:
                continue
            if holder.setdefault(role, bname) != bname:
                op = c.m.programs[pname].calls[ci].op
                yield Problem(f"programs.{pname}.calls[{ci}] (op {op})", f"touches buffer {bname!r} of role "
                              f"{role!r}, but program {pname!r} already has {holder[role]!r} in that role")
                holder[role] = bname  # report each extra holder once


def _accesses(c: Context, pname: str):
    """(call index, buffers touched, buffers read, (buffer, arg index) written) per call, in order."""
    buffers = c.m.buffers
    for ci, call in enumerate(c.m.programs[pname].calls):
        params = c.params.get(call.op)
        if params is None or len(params) != len(call.args):
            continue
        touched, reads, writes = [], [], []
        for ai, (p, a) in enumerate(zip(params, call.args)):
            if p.kind == "buffer" and type(a) is BufArg and a.buf in buffers:
                touched.append(a.buf)
                if p.direction != "out":
                    reads.append(a.buf)
                if p.direction != "in":
                    writes.append((a.buf, ai))
        yield ci, touched, reads, writes


# 10. unused declarations, topology ---------------------------------------------------------
def unused(c: Context) -> Iterator[Problem]:
    m = c.m
    used_bufs: set[str] = set()
    used_states: set[str] = set()
    used_ops: set[str] = set()
    exprs: list = []
    for _, call in m.calls():
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
            if p.batch.reach is not None:
                exprs.append(p.batch.reach)
    exprs.extend(m.constants.values())
    used_names = {e for e in exprs if type(e) is str}
    used_names.update(n for e in exprs if type(e) is not str and type(e) is not int for n in names(e))
    for kind, declared, used in (("buffers", m.buffers, used_bufs), ("states", m.states, used_states)):
        for n in declared:
            if n not in used:
                yield Problem(f"{kind}.{n}", "declared and unused (no call passes it)")
    for n in m.ops:
        if n not in used_ops:
            yield Problem(f"ops.{n}", "declared and unused (no call invokes it)")
    for kind, declared in (("vars", m.vars), ("constants", m.constants)):
        for n in declared:
            if n not in used_names:
                yield Problem(f"{kind}.{n}", "declared and unused (no expression names it)")


def topology(c: Context) -> Iterator[Problem]:
    t = c.m.topology
    if t.ranks < 1:
        yield Problem("topology.ranks", f"must be >= 1, got {t.ranks}")
        return
    if not 0 <= t.rank < t.ranks:
        yield Problem("topology.rank", f"must lie in [0, {t.ranks}), got {t.rank}")
    for g, lists in t.groups.items():
        seen = sorted(r for lst in lists for r in lst)
        if seen != list(range(t.ranks)):
            yield Problem(f"topology.groups.{g}", f"must place every rank 0..{t.ranks - 1} exactly once, got {seen}")
        if any(not lst for lst in lists):
            yield Problem(f"topology.groups.{g}", "a rank group cannot be empty")


ALL = (schema, vars_and_constants, buffers, states, modules, ops, calls, programs, unused, topology)
