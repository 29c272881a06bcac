"""The engine: load a verified manifest onto a device and run its programs.

Load = fetch modules (sha256 checked) -> allocate buffers and states -> bind weights ->
lower every program -> run `once` programs. Every step's vars and inputs are checked against
their bounds and domains before anything launches. Nothing here branches on a model."""

from __future__ import annotations

from math import prod
from pathlib import Path

import numpy as np

from ..manifest.expr import evaluate
from ..manifest.protocol import Protocol, derive
from ..manifest.verify import Verified
from .errors import BoundsError, DeviceError
from .lower import Launch, lower_program
from .modules import fetch
from .safetensors import Checkpoint
from .dtypes import NP
from .weights import bind_all

DEFAULT_STATE_BUDGET = 512 << 20


def make_device(v: Verified):
    target = v.manifest.target
    if target.device == "cpu":
        from .devices.cpu import CpuDevice

        return CpuDevice()
    try:
        from .devices.cuda.device import CudaDevice
    except ImportError as exc:
        raise DeviceError(f"manifest targets cuda {target.arch or ''}, but the CUDA device cannot load: {exc}. "
                          "Install kern with the cuda extra (pip install 'kern-engine[cuda]') on a machine "
                          "with an NVIDIA GPU and driver.") from None
    return CudaDevice(arch=target.arch)


class Engine:
    def __init__(self, v: Verified, weights: str | Path | None, *, device=None,
                 state_budget: int = DEFAULT_STATE_BUDGET, state_sizes: dict[str, int] | None = None,
                 chunk_bytes: int | None = None):
        if not isinstance(v, Verified):
            raise TypeError("Engine takes a Verified manifest (kern.manifest.load_verified)")
        self.v = v
        self.m = v.manifest
        self.consts = v.constants
        self.protocol: Protocol = derive(v)
        self.device = device or make_device(v)
        self.max_env = {**self.consts, **{n: var.max for n, var in self.m.vars.items()}}
        for name, mod in self.m.modules.items():
            self.device.load_module(name, fetch(name, mod.source, mod.sha256, v.base_dir))
        self.shapes = {n: tuple(evaluate(d, self.max_env) for d in b.shape) for n, b in self.m.buffers.items()}
        self._alloc_states(state_budget, state_sizes or {}, chunk_bytes)
        self.buffers = {}
        weights_needed = {n: (b, self.shapes[n]) for n, b in self.m.buffers.items() if b.kind == "weight"}
        host_weights = {}
        if weights_needed:
            if weights is None:
                raise DeviceError("this manifest binds weights: give the checkpoint folder")
            ckpt = Checkpoint(weights)
            by_dtype: dict[str, dict] = {}
            for n, (b, s) in weights_needed.items():
                by_dtype.setdefault(b.dtype, {})[n] = (b, s)
            for dt, group in by_dtype.items():
                host_weights.update(bind_all(group, ckpt, NP[dt]))
        for n, b in self.m.buffers.items():
            self.buffers[n] = self.device.alloc(b.dtype, prod(self.shapes[n]), staged=b.kind == "input")
            if n in host_weights:
                self.device.write(self.buffers[n], host_weights.pop(n))
        self.launches: dict[str, list[Launch]] = {p: lower_program(v, p) for p in self.m.programs}
        self.programs = {p: self.device.lower(ls, self.buffers, self.states, self.consts,
                                              graph=self.m.programs[p].graph)
                         for p, ls in self.launches.items()}
        for p in self.protocol.once:
            self.run(p, {})

    def _alloc_states(self, budget: int, sizes: dict[str, int], chunk_bytes: int | None) -> None:
        """Each state's memory: `sizes[name]` bytes when given (the pool's layout: a virtual
        range of `chunk_bytes` chunks that the pool's plans map), else what the budget holds
        (pages of a paged state, slots of a per-sequence state), fully backed."""
        self.states = {}
        self.pages: dict[str, int] = {}
        self.state_bytes: dict[str, int] = {}
        paged = self.protocol.paged_states
        for name, st in self.m.states.items():
            if st.bytes_per_token is not None:
                per_page = evaluate(st.bytes_per_token, self.consts) * max(paged.get(name, 1), 1)
                size = sizes.get(name, max(budget // per_page, 1) * per_page)
                self.pages[name] = size // per_page
                self.state_bytes[name] = per_page
            elif st.bytes_per_seq is not None:
                per = evaluate(st.bytes_per_seq, self.consts)
                size = sizes.get(name, max(budget // per, 1) * per)
                self.state_bytes[name] = per
            else:
                size = evaluate(st.bytes, self.consts)
                self.state_bytes[name] = size
            chunked = chunk_bytes if name in sizes and st.bytes is None else None
            self.states[name] = self.device.alloc_state(size, chunk_bytes=chunked)

    # ---- stepping ----------------------------------------------------------------------
    def env(self, program: str, vars: dict[str, int]) -> dict[str, int]:
        """consts + vars for a step: given vars checked against their bounds, others at max."""
        env = dict(self.max_env)
        for name, val in vars.items():
            var = self.m.vars.get(name)
            if var is None:
                raise BoundsError(f"program {program!r}: no var named {name!r}")
            if not 1 <= val <= var.max:
                raise BoundsError(f"program {program!r}: var {name} = {val} is outside its bounds [1, {var.max}]; "
                                  "refused before launch")
            env[name] = val
        return env

    def shape(self, buffer: str, env: dict[str, int]) -> tuple[int, ...]:
        return tuple(evaluate(d, env) for d in self.m.buffers[buffer].shape)

    def write_input(self, program: str, buffer: str, host: np.ndarray, env: dict[str, int]) -> None:
        b = self.m.buffers[buffer]
        shape = self.shape(buffer, env)
        arr = np.asarray(host)
        if arr.shape != shape:
            raise BoundsError(f"program {program!r}: input {buffer!r}{f' ({b.fill})' if b.fill else ''} has shape "
                              f"{list(arr.shape)}, the step needs {list(shape)}")
        d = b.domain
        if d is not None and arr.size:
            lo_v, hi_v = int(arr.min()), int(arr.max())
            if d.range is not None:
                lo, hi = evaluate(d.range[0], env), evaluate(d.range[1], env)
                if lo_v < lo or hi_v >= hi:
                    raise BoundsError(f"program {program!r}: input {buffer!r} holds values in [{lo_v}, {hi_v}], "
                                      f"outside its domain [{lo}, {hi}); refused before launch")
            if d.index_into is not None:
                n = self.pages[d.index_into]
                if lo_v < 0 or hi_v >= n:
                    raise BoundsError(f"program {program!r}: page table {buffer!r} holds pages [{lo_v}, {hi_v}], "
                                      f"state {d.index_into!r} has {n} pages; refused before launch")
        self.device.write(self.buffers[buffer], np.ascontiguousarray(arr, dtype=NP[b.dtype]))

    def run(self, program: str, vars: dict[str, int], inputs: dict[str, np.ndarray] | None = None,
            trace=None) -> dict[str, int]:
        """Check, write inputs, run one program. Returns the step's env (for reading outputs)."""
        if program not in self.programs:
            raise BoundsError(f"no program named {program!r}; the manifest has {', '.join(self.programs)}")
        env = self.env(program, vars)
        for buf, host in (inputs or {}).items():
            if self.m.buffers[buf].kind != "input":
                raise BoundsError(f"program {program!r}: {buf!r} is a {self.m.buffers[buf].kind} buffer, not an input")
            self.write_input(program, buf, host, env)
        if trace is None:
            self.programs[program].run(env)
        else:
            self.programs[program].run(env, trace)
        return env

    def read(self, buffer: str, env: dict[str, int]) -> np.ndarray:
        b = self.m.buffers[buffer]
        return self.device.read(self.buffers[buffer], b.dtype, self.shape(buffer, env))

    def remap_state(self, state: str, unmap: list[int], map: list[tuple[int, int]]) -> None:
        """Unmap chunks of a state's virtual range, then map (physical chunk, place) pairs."""
        self.device.remap(self.states[state], unmap, map)

    def copy_state(self, state: str, dst: int, src: int, nbytes: int) -> None:
        """Copy bytes within a state's memory (a pool plan's page copy)."""
        self.device.copy_bytes(self.states[state], dst, src, nbytes)

    def page_bytes(self, state: str) -> int:
        return self.state_bytes[state]
