"""The engine: load a verified manifest onto a device and run its programs.

Load = fetch modules (sha256 checked) -> allocate buffers and states -> bind weights ->
lower every program -> run `once` programs. Every step's vars and inputs are checked against
their bounds and domains before anything launches. Nothing here branches on a model."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from math import prod
from pathlib import Path
from typing import Self

import numpy as np

from ..manifest.expr import evaluate
from ..manifest.schema import DTYPE_BYTES
from ..manifest.protocol import ServingProtocol, derive, prompt_keys
from ..manifest.verify import Verified
from .device import Device, Program
from ..errors import BoundsError
from .errors import DeviceError
from .lower import LoweredLaunch, lower_program
from .paging import DEFAULT_STATE_BUDGET, Paging, auto_budget, host_budget, state_sizes
from .placement import alloc_named, alloc_states, make_device, pool_for
from .pointers import fill_pointers, pointer_tables
from ..files.modules import fetch
from ..files.safetensors import WeightFiles
from .dtypes import NP
from ..files.weights import bind_all

@dataclass(frozen=True)
class Checked:
    """One step, checked (Engine.checked): its program, env and inputs (contiguous, in their
    buffers' dtypes)."""

    program: str
    env: dict[str, int]
    inputs: dict[str, np.ndarray]


@dataclass(frozen=True)
class CheckedSteps:
    """run_steps' arguments, checked (Engine.checked_steps): the first step, then each later
    step's varying inputs, the feedback pairs and the outputs collected."""

    first: Checked
    later: list[dict[str, np.ndarray]]
    varying: list[str]
    feedback: dict[str, str]
    collect: list[str]


class Engine:
    def __init__(self, v: Verified, weights: str | Path | None, *, device: Device | None = None,
                 state_budget: int | None = DEFAULT_STATE_BUDGET, paged: bool = False, host_bytes: int | None = 0,
                 own_paging: bool = True):
        """`paged`: the states take the layout of a pool under `state_budget` (virtual ranges of
        chunks its plans map, `host_bytes` of host tier, None: paging.host_budget's default) and
        the engine owns `paging`, the pool bound to its states. Else each state is what the budget holds, fully backed.
        `state_budget` None: the device's share (auto_budget), decided once the weights and
        buffers are placed; `memory_note` says what was taken. own_paging False: the pool is
        planned (`pool`) but bound to nothing yet; a split's RankedEngine binds rank 0's to
        itself, so its plans run on every rank's states."""
        if not isinstance(v, Verified):
            raise TypeError("Engine takes a Verified manifest (kern.manifest.load_verified)")
        self.v = v
        self.m = v.manifest
        self.consts = v.constants
        self.protocol: ServingProtocol = derive(v)
        self.device: Device = device or make_device(v)
        self._own_device, self.closed = device is None, False  # close() gives back a device it made
        try:
            self._load(weights, state_budget, paged, host_bytes, own_paging)
        except BaseException:  # a load that fails (a bad checkpoint, the memory short) holds nothing after
            self.close()
            raise

    def _load(self, weights: str | Path | None, state_budget: int | None, paged: bool, host_bytes: int | None,
              own_paging: bool) -> None:
        v = self.v
        self.max_env = {**self.consts, **{n: var.max for n, var in self.m.vars.items()}}
        for name, mod in self.m.modules.items():
            self.device.load_module(name, fetch(name, mod.source, mod.sha256, v.base_dir))
        self.shapes = {n: tuple(evaluate(d, self.max_env) for d in b.shape) for n, b in self.m.buffers.items()}
        self.buffers = {}
        weights_needed = {n: (b, self.shapes[n]) for n, b in self.m.buffers.items() if b.kind == "weight"}
        host_weights = {}
        if weights_needed:
            if weights is None:
                raise DeviceError("this manifest binds weights: give the checkpoint folder")
            ckpt = WeightFiles(weights)
            by_dtype: dict[str, dict] = {}
            for n, (b, s) in weights_needed.items():
                by_dtype.setdefault(b.dtype, {})[n] = (b, s)
            for dt, group in by_dtype.items():
                host_weights.update(bind_all(group, ckpt, NP[dt]))
        for n, b in self.m.buffers.items():
            nbytes = prod(self.shapes[n]) * DTYPE_BYTES[b.dtype]
            self.buffers[n] = alloc_named(f"buffers.{n}", nbytes, self.device.alloc, b.dtype, prod(self.shapes[n]),
                                          staged=b.kind == "input")
            if n in host_weights:
                self.device.write(self.buffers[n], host_weights.pop(n))
        self.state_budget, self.memory_note = auto_budget(self.device, state_budget)
        pool = pool_for(self, self.state_budget, host_budget(self.state_budget, host_bytes)) if paged else None
        self.states, self.pages, self.slots, self.state_bytes = alloc_states(
            self, self.state_budget, state_sizes(pool) if pool else {}, pool.layout.chunk_bytes if pool else None)
        fill_pointers(pointer_tables(self.m, self.shapes),
                      lambda e: self.device.address(self.buffers[e] if e in self.buffers else self.states[e]),
                      lambda n, table: self.device.write(self.buffers[n], table))
        self.launches: dict[str, list[LoweredLaunch]] = {p: lower_program(v, p) for p in self.m.programs}
        self.programs: dict[str, Program] = {p: self.device.lower(ls, self.buffers, self.states,
                                                                  graph=self.m.programs[p].graph)
                                             for p, ls in self.launches.items()}
        # told of every step (program, env, its inputs) once checked, before it runs: kern serve --trace
        self.observers: list[Callable[[str, dict[str, int], dict[str, np.ndarray]], None]] = []
        for p in self.protocol.once:
            self.run(p, {})
        self.pool = pool
        self.paging = Paging(pool, self) if pool and own_paging else None

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

    def _step_bytes(self, buffer: str, env: dict[str, int]) -> int:
        """Bytes of `buffer` at this step's shape (a prefix of its allocation)."""
        return prod(self.shape(buffer, env)) * DTYPE_BYTES[self.m.buffers[buffer].dtype]

    def check_input(self, program: str, buffer: str, host: np.ndarray, env: dict[str, int]) -> np.ndarray:
        """`host` checked against the input's shape for this step and its domain; returned
        contiguous, in the buffer's dtype."""
        b = self.m.buffers[buffer]
        if b.kind != "input":
            raise BoundsError(f"program {program!r}: {buffer!r} is a {b.kind} buffer, not an input")
        shape = self.shape(buffer, env)
        arr = np.asarray(host)
        if arr.shape != shape:
            raise BoundsError(f"program {program!r}: input {buffer!r}{f' ({b.fill})' if b.fill else ''} has shape "
                              f"{list(arr.shape)}, the step needs {list(shape)}")
        slot_state = (self.protocol.slot_buffers or {}).get(buffer)
        slots = self.slots.get(slot_state) if slot_state is not None else None
        if slots is not None and arr.size and not 0 <= int(arr.min()) <= int(arr.max()) < slots:
            raise BoundsError(f"program {program!r}: input {buffer!r} (slot) holds slots [{int(arr.min())}, "
                              f"{int(arr.max())}], state {slot_state!r} has {slots}; refused before launch")
        d = b.domain if slot_state is None else None
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
        return np.ascontiguousarray(arr, dtype=NP[b.dtype])

    def write_input(self, program: str, buffer: str, host: np.ndarray, env: dict[str, int]) -> None:
        self._open()
        self.device.write(self.buffers[buffer], self.check_input(program, buffer, host, env))

    def run(self, program: str, vars: dict[str, int], inputs: dict[str, np.ndarray] | None = None,
            wait: bool = True) -> dict[str, int]:
        """Check, write inputs, run one program. Returns the step's env (for reading outputs).
        `wait=False`: return once launched; a read of its outputs waits (the caller writes none
        of its inputs before then: another program's launches may go meanwhile)."""
        return self.run_checked(self.checked(program, vars, inputs), wait)

    def close(self) -> None:
        """Give the device memory back: everything the device this engine made holds (weights,
        buffers, states, graphs; a device handed in is its maker's to close). Once; a step
        afterwards is refused in one line. kern's device memory is freed only so: an engine
        dropped without close() keeps it until the process ends."""
        if not self.closed:
            self.closed = True
            if self._own_device:
                self.device.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _open(self) -> None:
        if self.closed:
            raise DeviceError("this engine is closed (its device memory given back): open a new one")

    def checked(self, program: str, vars: dict[str, int], inputs: dict[str, np.ndarray] | None = None) -> "Checked":
        """A step's env and inputs checked against their bounds and domains, nothing written: what
        run_checked runs, on this engine or any of the same manifest (the ranks of a split
        deployment check once and each run it)."""
        self._open()
        if program not in self.programs:
            raise BoundsError(f"no program named {program!r}; the manifest has {', '.join(self.programs)}")
        env = self.env(program, vars)
        arrays = {}
        for buf, host in (inputs or {}).items():
            self._known(program, buf)
            arrays[buf] = self.check_input(program, buf, host, env)
        self._keys(program, vars, env, arrays)
        return Checked(program, env, arrays)

    def _keys(self, program: str, vars: dict[str, int], env: dict[str, int], arrays: dict[str, np.ndarray]) -> None:
        """A program whose batch has a keys var (Batch.keys) gets it from the step's own inputs
        unless the caller set it: whoever drives the program, its launches are sized by the
        keys its prompt rows really attend over, and a step past the var's bound is refused here
        rather than overrunning a workspace."""
        st = next((s for s in self.protocol.every if s.program == program), None)
        if st is None or st.keys_var is None or st.keys_var in vars:
            return
        roles = [st.inputs.get(r) for r in ("cu_seqlens", "position", "prompt_len")]
        if not all(b in arrays for b in roles):
            return  # inputs already on the device: the var stays at its bound
        cu, pos, plen = (arrays[b] for b in roles)
        keys = prompt_keys(cu, pos, plen)
        if keys > st.keys_max:
            raise BoundsError(f"program {program!r}: its prompt rows attend over {keys} keys, above the var bound "
                              f"{st.keys_var} <= {st.keys_max}; refused before launch (fewer or shorter sequences a step)")
        env[st.keys_var] = max(1, keys)

    def run_checked(self, step: "Checked", wait: bool = True) -> dict[str, int]:
        for buf, arr in step.inputs.items():
            self.device.write(self.buffers[buf], arr)
        for see in self.observers:
            see(step.program, step.env, step.inputs)
        self.programs[step.program].run(step.env, wait)
        return step.env

    def runs_steps_natively(self, program: str) -> bool:
        """Whether run_steps runs this program's steps on the device without the host in
        between (CUDA: one graph launch) rather than as a host loop of single steps."""
        return self.programs[program].runs_steps_natively

    def run_steps(self, program: str, vars: dict[str, int], inputs: dict[str, np.ndarray],
                  steps: list[dict[str, np.ndarray]], feedback: dict[str, str],
                  collect: list[str], each: Callable[[int, dict[str, np.ndarray]], None] | None = None
                  ) -> list[dict[str, np.ndarray]]:
        """Run `program` 1 + len(steps) times back to back, as a decode loop does: the first time
        with `inputs`; step j >= 1 with `steps[j - 1]` (the inputs that change, each step the
        same ones: positions) and every `feedback` input (output -> input) set on the device
        from the output of step j - 1 (the token). Returns each step's `collect` outputs (the
        feedback outputs always among them). Everything is checked before anything launches.
        The host waits once: on CUDA the whole run is one graph launch; the cpu loops.
        `each(j, outputs)`: called with step j's outputs as soon as they are on the host, while
        the later steps still run (a server streams each step's tokens as they come)."""
        return self.run_checked_steps(self.checked_steps(program, vars, inputs, steps, feedback, collect), each)

    def checked_steps(self, program: str, vars: dict[str, int], inputs: dict[str, np.ndarray],
                      steps: list[dict[str, np.ndarray]], feedback: dict[str, str],
                      collect: list[str]) -> "CheckedSteps":
        """run_steps' arguments checked, nothing written (as checked() for run)."""
        self._open()
        if program not in self.programs:
            raise BoundsError(f"no program named {program!r}; the manifest has {', '.join(self.programs)}")
        env = self.env(program, vars)
        collect = list(dict.fromkeys([*collect, *feedback]))
        for buf in collect:
            self._known(program, buf)
        varying = list(steps[0]) if steps else []
        for j, st in enumerate(steps):
            if sorted(st) != sorted(varying):
                raise BoundsError(f"program {program!r}: step {j + 1} writes inputs {sorted(st)}, step 1 writes "
                                  f"{sorted(varying)}; every step must write the same ones")
        for src, dst in feedback.items():
            self._known(program, dst)
            if self.m.buffers[dst].kind != "input":
                raise BoundsError(f"program {program!r}: feedback {src!r} -> {dst!r}: {dst!r} is a "
                                  f"{self.m.buffers[dst].kind} buffer, not an input")
            if dst in varying:
                raise BoundsError(f"program {program!r}: {dst!r} is fed back from {src!r} and also written by the steps")
            a, b = self.m.buffers[src], self.m.buffers[dst]
            if (a.dtype, self.shape(src, env)) != (b.dtype, self.shape(dst, env)):
                raise BoundsError(f"program {program!r}: feedback {src!r} {a.dtype}{list(self.shape(src, env))} "
                                  f"-> {dst!r} {b.dtype}{list(self.shape(dst, env))}: shapes and dtypes must match")
        for buf in [*inputs, *varying]:
            self._known(program, buf)
        first = {buf: self.check_input(program, buf, host, env) for buf, host in inputs.items()}
        later = [{buf: self.check_input(program, buf, st[buf], env) for buf in varying} for st in steps]
        return CheckedSteps(Checked(program, env, first), later, varying, dict(feedback), collect)

    def run_checked_steps(self, plan: "CheckedSteps",
                          each: Callable[[int, dict[str, np.ndarray]], None] | None = None) -> list[dict[str, np.ndarray]]:
        program, env, first = plan.first.program, plan.first.env, plan.first.inputs
        later, varying, feedback, collect = plan.later, plan.varying, plan.feedback, plan.collect
        for buf, arr in first.items():
            self.device.write(self.buffers[buf], arr)
        for see in self.observers:
            for j in range(1 + len(later)):
                see(program, env, {**first, **later[j - 1]} if j else first)
        shapes = {c: self.shape(c, env) for c in collect}

        def typed(step: list[np.ndarray]) -> dict[str, np.ndarray]:
            return {c: r.view(NP[self.m.buffers[c].dtype]).reshape(shapes[c]).copy() for c, r in zip(collect, step)}

        raw = self.programs[program].run_steps(
            env, [[st[b] for b in varying] for st in later], [self.buffers[b] for b in varying],
            [(self.buffers[s], self.buffers[d], self._step_bytes(d, env)) for s, d in feedback.items()],
            [(self.buffers[c], self._step_bytes(c, env)) for c in collect],
            None if each is None else lambda j, step: each(j, typed(step)))
        outs = [typed(step) for step in raw]
        # what the device holds now, in the inputs' mirrors: the last step's inputs and fed values
        for buf in varying:
            self.device.write(self.buffers[buf], later[-1][buf])
        for src, dst in feedback.items():
            self.device.write(self.buffers[dst], outs[-1][src])
        return outs

    def _known(self, program: str, buf: str) -> None:
        if buf not in self.m.buffers:
            raise BoundsError(f"program {program!r}: no buffer named {buf!r}")

    def read(self, buffer: str, env: dict[str, int]) -> np.ndarray:
        self._open()
        b = self.m.buffers[buffer]
        return self.device.read(self.buffers[buffer], b.dtype, self.shape(buffer, env))

    def read_rows(self, buffer: str, env: dict[str, int], rows: list[int]) -> np.ndarray:
        """Some rows of an output, a copy each: [len(rows), *row shape]. A step whose host reads
        the logits of a few rows (a grammar's, a logprobs request's) copies only theirs, not
        every row's vocabulary."""
        self._open()
        b = self.m.buffers[buffer]
        shape = self.shape(buffer, env)
        width = prod(shape[1:])
        out = np.empty((len(rows), *shape[1:]), NP[b.dtype])
        for j, r in enumerate(rows):
            out[j] = self.device.read(self.buffers[buffer], b.dtype, shape[1:], r * width)
        return out

    def remap_state(self, state: str, unmap: list[int], map: list[tuple[int, int]]) -> None:
        """Unmap chunks of a state's virtual range, then map (physical chunk, place) pairs."""
        self._open()
        self.device.remap(self.states[state], unmap, map)

    def copy_state(self, state: str, dst: int, src: int, nbytes: int) -> None:
        """Copy bytes within a state's memory (a pool plan's page copy)."""
        self._open()
        self.device.copy_bytes(self.states[state], dst, src, nbytes)

    def domain(self, buffer: str) -> tuple[int, int]:
        """The [lo, hi) range an input's values must lie in, at the vars' bounds."""
        d = self.m.buffers[buffer].domain
        if d is None or d.range is None:
            return (-(1 << 31), 1 << 31)
        return evaluate(d.range[0], self.max_env), evaluate(d.range[1], self.max_env)

    def read_state(self, state: str, offset: int, nbytes: int) -> np.ndarray:
        """Bytes of a state's memory (a checkpoint's page parked to host memory)."""
        self._open()
        return self.device.read(self.states[state], "u8", (nbytes,), offset)

    def write_state(self, state: str, offset: int, data: np.ndarray) -> None:
        """Write bytes into a state's memory (a parked page woken)."""
        self._open()
        self.device.write(self.states[state], data, offset)

    def page_bytes(self, state: str) -> int:
        return self.state_bytes[state]
