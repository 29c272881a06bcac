"""3. buffers: shapes resolve; byte sizes do not overflow at the var bounds, and everything the
runtime allocates at load fits the target's memory budget; fills sit on buffers of the right
dtype and direction; domains are well formed; peer and pointers buffers name what they mirror."""

from __future__ import annotations

from collections.abc import Iterator
from math import prod

from ..context import Context
from ..limits import INT32_MAX, MAX_BYTES, MAX_DIMS, MEMORY
from ..schema import DTYPE_BYTES, INPUT_ROLES
from ..problems import OverBudget, Problem

_ROLE_DTYPES = {"token": ("i32",), "position": ("i32",), "slot": ("i32",), "seq_len": ("i32",),
                "cu_seqlens": ("i32",), "temperature": ("f32",), "rng": ("i32",), "mask": ("i32",),
                "mask_row": ("i32",), "prompt_len": ("i32",), "tokens": ("i32",),
                "logits": ("f32", "bf16", "f16"), "accepted": ("i32",)}
_INTEGER = ("i32", "u32", "i64", "u64", "i8", "u8")


def buffers(c: Context) -> Iterator[Problem]:
    m = c.m
    for name, b in m.buffers.items():
        where = f"buffers.{name}"
        if len(b.shape) > MAX_DIMS:
            yield Problem(f"{where}.shape", f"has {len(b.shape)} dimensions; at most {MAX_DIMS}")
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
            elif c.device == "cuda" and elems > INT32_MAX:
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
            if seg.fallback == seg.tensor:
                yield Problem(f"{where}.bind[{i}].fallback", f"names the segment's own tensor {seg.tensor!r}")
            for axis in ("rows", "cols"):
                rng = getattr(seg, axis)
                if rng is not None and not (0 <= rng[0] < rng[1] <= MAX_BYTES):
                    yield Problem(f"{where}.bind[{i}].{axis}",
                                  f"range must satisfy 0 <= lo < hi <= {MAX_BYTES}, got {list(rng)}")
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
            if c.missing("states", d.index_into):
                yield Problem(f"{where}.domain.index_into", f"no state named {d.index_into!r}")
        elif b.fill == "slot":  # a slot input names the per-sequence state whose slots it holds
            if st.bytes_per_seq is None:
                yield Problem(f"{where}.domain.index_into", f"a slot input indexes a per-sequence state; "
                              f"{d.index_into!r} has no bytes_per_seq")
        elif st.bytes_per_token is None:
            yield Problem(f"{where}.domain.index_into", f"state {d.index_into!r} is not paged (no bytes_per_token)")
        if d.range is not None:
            yield Problem(f"{where}.domain", "give range or index_into, not both")
        if b.fill == "slot":
            if d.stride is not None:
                yield Problem(f"{where}.domain.stride", "a slot input indexes slots, it has no stride")
        elif d.stride is None:
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
            if c.missing("buffers", b.of):
                yield Problem(f"{where}.of", f"no buffer named {b.of!r}")
        elif m.buffers[b.of].kind in ("peer", "pointers", "input", "weight"):
            yield Problem(f"{where}.of", f"buffer {b.of!r} is {m.buffers[b.of].kind}; only device memory that "
                          "calls write (workspace, carry, output) is exported")
        if m.topology.ranks < 2 and not c.broken.has_field("topology"):
            yield Problem(where, "peer buffers need a topology of 2 or more ranks")
    elif b.of is not None:
        yield Problem(f"{where}.of", f"only peer buffers have of, this is {b.kind}")
    if b.kind == "pointers":
        if not b.entries:
            yield Problem(where, "a pointers buffer lists the buffers whose addresses it holds (entries)")
        for i, e in enumerate(b.entries or []):
            if e not in m.buffers and e not in m.states and c.missing("buffers", e) and c.missing("states", e):
                yield Problem(f"{where}.entries[{i}]", f"no buffer or state named {e!r}")
        if b.dtype != "u64":
            yield Problem(f"{where}.dtype", f"a pointers buffer holds u64 addresses, got {b.dtype}")
    elif b.entries is not None:
        yield Problem(f"{where}.entries", f"only pointers buffers have entries, this is {b.kind}")


def memory(c: Context) -> Iterator[Problem]:
    """What the runtime allocates at load fits the target's memory: every buffer at the var
    maxima (the runtime sizes buffers for the largest step) plus one page, slot or block of each
    state (the least a state can be; the rest is the caller's budget). Arithmetic only."""
    if c.device is None:
        return
    sizes: dict[str, int] = {}
    for name, b in c.m.buffers.items():
        his = [c.quiet_bounds(d) for d in b.shape]
        if any(r is None for r in his):
            return  # an unresolved shape is reported by the buffers check
        sizes[f"buffers.{name}"] = prod(r[1] for r in his) * DTYPE_BYTES[b.dtype]
        if sizes[f"buffers.{name}"] > MAX_BYTES:
            return  # reported by the buffers check
    strides: dict[str, int] = {}
    for b in c.m.buffers.values():
        if b.domain is not None and b.domain.index_into and b.domain.stride is not None:
            r = c.quiet_bounds(b.domain.stride)
            if r is not None:
                strides[b.domain.index_into] = max(strides.get(b.domain.index_into, 1), r[1])
    for name, s in c.m.states.items():
        size = s.bytes_per_token if s.bytes_per_token is not None else s.bytes_per_seq if s.bytes_per_seq is not None \
            else s.bytes
        r = c.quiet_bounds(size) if size is not None else None
        if r is None:
            return
        sizes[f"states.{name}"] = r[1] * (strides.get(name, 1) if s.bytes_per_token is not None else 1)
    budget = MEMORY[c.device]
    total = sum(sizes.values())
    if total > budget:
        top = sorted(sizes.items(), key=lambda kv: -kv[1])[:3]
        need = (f"needs {_gib(total)} at load (buffers at the var maxima, one page or slot of each state), "
                f"over the {c.device} budget of {_gib(budget)}")
        yield OverBudget(top[0][0], f"{need}; largest: " + ", ".join(f"{n} {_gib(s)}" for n, s in top), need)


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n < 2**70 else f"2**{n.bit_length() - 1} bytes"
