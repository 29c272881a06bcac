"""Ranks: one process driving the N ranks of a split manifest, one thread a rank.

A tensor-parallel deployment is one verified manifest a rank (`rank0.json`, `rank1.json`, ...
side by side with the kernels). `RankedEngine` loads each onto its own device (cpu: a
`CpuDevice` a rank; cuda: GPU r), links them (peer tables, peer access, NCCL) and offers the
`Engine`'s face to the host loop: a step's inputs go to every rank, every rank runs the
program, the outputs are read from rank 0 (every rank computes the same ones).

Why threads of one process: the host loop, the scheduler, the pool and the server stay as they
are (one `Paging`, whose plans run on every rank's states), and every rank's launches are issued
at once and each waits on its own: a rank's kernels wait for the others inside the all-reduce,
so a single thread that launched and waited rank after rank would deadlock the first
all-reduce. Each thread owns its rank's device (a CUDA context is current per thread) and
captures its own graphs. One process per rank (torchrun, Slurm: `load_split` under WORLD_SIZE)
is `kern.world.processes`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from queue import SimpleQueue
from typing import Any, Self

import numpy as np

from ..manifest import load_verified
from ..manifest.verify import Verified
from ..runtime.device import Device
from ..runtime.engine import DEFAULT_STATE_BUDGET, Engine
from ..runtime.paging import Paging
from ..errors import KernError
from ..runtime.errors import DeviceError


class RankError(KernError):
    """The ranks of a split deployment do not fit together (files, topology, devices)."""


def rank_manifests(deployment: Verified | str | Path) -> list[Verified]:
    """Every rank's verified manifest of the split deployment that `deployment` (one of its rank
    manifests, verified or a path) belongs to: itself and its siblings rank0.json ..
    rank{N-1}.json, N = its topology's ranks, each verified once. Each must say it is rank r of
    the same N with the same groups."""
    first = deployment if isinstance(deployment, Verified) else load_verified(deployment)
    t = first.manifest.topology
    folder = first.base_dir
    out = []
    for r in range(t.ranks):
        p = folder / f"rank{r}.json"
        if not p.is_file():
            raise RankError(f"{folder}: a {t.ranks}-rank deployment needs rank{r}.json beside rank{t.rank}.json")
        v = first if r == t.rank else load_verified(p)
        tr = v.manifest.topology
        if (tr.ranks, tr.rank, tr.groups) != (t.ranks, r, t.groups):
            raise RankError(f"{p}: topology says rank {tr.rank} of {tr.ranks} (groups {tr.groups}), the deployment "
                            f"needs rank {r} of {t.ranks} (groups {t.groups})")
        out.append(v)
    return out


class Workers:
    """One daemon thread a rank; `each(fn)` runs fn(rank) on every rank's thread at once."""

    def __init__(self, n: int):
        self.inbox: list[SimpleQueue] = [SimpleQueue() for _ in range(n)]
        for r, q in enumerate(self.inbox):
            threading.Thread(target=self._serve, args=(q,), name=f"kern-rank-{r}", daemon=True).start()

    @staticmethod
    def _serve(q: SimpleQueue) -> None:
        while True:
            fn, reply = q.get()
            try:
                reply.put((True, fn()))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller, raised there
                reply.put((False, exc))

    def each(self, fn: Callable[[int], Any]) -> list:
        """fn(r) on rank r's thread for every r; the results in rank order. The first rank to
        fail raises its error at once (the others, waiting on it in an all-reduce, give up on
        their own: the kernels' waits are bounded)."""
        reply: SimpleQueue = SimpleQueue()
        for r, q in enumerate(self.inbox):
            q.put((lambda r=r: (r, fn(r)), reply))
        got: dict[int, Any] = {}
        for _ in self.inbox:
            ok, val = reply.get()
            if not ok:
                raise val
            got[val[0]] = val[1]
        return [got[r] for r in range(len(self.inbox))]

    def on(self, rank: int, fn: Callable[[], Any]) -> Any:
        reply: SimpleQueue = SimpleQueue()
        self.inbox[rank].put((fn, reply))
        ok, val = reply.get()
        if not ok:
            raise val
        return val


def rank_device(v: Verified, ordinal: int) -> Device:
    """The device rank `ordinal` of this process runs on: a cpu device of its own, or GPU `ordinal`."""
    target = v.manifest.target
    if target.device == "cpu":
        from ..runtime.devices.cpu import CpuDevice

        return CpuDevice()
    try:
        from ..runtime.devices.cuda.device import CudaDevice
    except ImportError as exc:
        raise DeviceError(f"manifest targets cuda {target.arch or ''}, but the CUDA device cannot load: {exc}") from None
    return CudaDevice(arch=target.arch, ordinal=ordinal)


def address(storage: Any) -> int:
    """The address kernels of any rank of this process reach a buffer at (host or device)."""
    return int(storage.ctypes.data) if isinstance(storage, np.ndarray) else int(storage.ptr)


class OnThreads:
    """close() and `with` for an engine over engines of its own, one worker thread each
    (RankedEngine's ranks, StagedEngine's stages): each one's device memory given back on its
    own thread (Engine.close; the devices are rank_device's, made for this engine); so does a
    load that fails on any rank. NCCL communicators stay (not yet destroyed on close)."""

    workers: Workers
    closed = False

    def _parts(self) -> list[Engine]:
        raise NotImplementedError

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            close_parts(self.workers, self._parts())

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def close_parts(workers: Workers, parts: list[Engine | None]) -> None:
    """Each part's engine and its device (rank_device's) closed on the part's own thread."""
    workers.each(lambda k: parts[k] is not None and (parts[k].close(), parts[k].device.close()))


def open_parts(workers: Workers, part: Callable[[int], tuple[Verified, int, dict]],
               weights: str | Path | None) -> list[Engine]:
    """Each part's engine on its own thread, on rank_device of its (manifest, ordinal) with its
    Engine options (`part(k)`). A load that fails on any part holds nothing after it: the parts
    that loaded are closed and every device given back before the first error is raised."""
    def load(k: int) -> tuple[Engine | None, BaseException | None]:  # never raises: every part reports
        v, ordinal, kw = part(k)
        try:
            device = rank_device(v, ordinal)
        except BaseException as exc:  # noqa: BLE001 - raised below, once every part is done
            return None, exc
        try:
            return Engine(v, weights, device=device, **kw), None
        except BaseException as exc:  # noqa: BLE001
            device.close()
            return None, exc

    loaded = workers.each(load)
    engines = [e for e, _ in loaded]
    failed = [exc for _, exc in loaded if exc is not None]
    if failed:
        close_parts(workers, engines)
        raise failed[0]
    return engines


class RankedEngine(OnThreads):
    """N ranks' engines behind the Engine's face (what the host loop, the API and the benches use)."""

    def __init__(self, verified: list[Verified], weights: str | Path | None, *,
                 state_budget: int | None = DEFAULT_STATE_BUDGET, paged: bool = False, host_bytes: int = 0,
                 ordinals: list[int] | None = None):
        # every rank's pool has the same layout: one budget for all, not each device's own share
        state_budget = DEFAULT_STATE_BUDGET if state_budget is None else state_budget
        if host_bytes:
            raise RankError("the host tier holds one rank's pages: a split deployment runs without it (host_bytes 0)")
        n = len(verified)
        ordinals = ordinals or list(range(n))
        self.workers = Workers(n)
        self.ranks: list[Engine] = open_parts(self.workers, lambda r: (verified[r], ordinals[r], {
            "state_budget": state_budget, "paged": paged, "own_paging": False}), weights)
        try:
            link(self.ranks, self.workers)
        except BaseException:
            self.close()
            raise
        e0 = self.ranks[0]
        self.v, self.m, self.consts, self.protocol = e0.v, e0.m, e0.consts, e0.protocol
        self.shapes, self.launches, self.max_env, self.device = e0.shapes, e0.launches, e0.max_env, e0.device
        self.observers = e0.observers  # told of every step once (kern serve --trace), by rank 0
        # the loop's one pool (rank 0's plan): its plans (chunk maps, page copies) run on every
        # rank's states, which have the same layout (the ranks' manifests declare the same sizes)
        self.paging = Paging(e0.pool, self) if e0.pool else None

    def _parts(self) -> list[Engine]:
        return self.ranks

    # ---- stepping: every rank ---------------------------------------------------------------
    # The step is checked once, here (the ranks' manifests agree on every buffer a step writes),
    # and each rank's thread only writes and launches: the threads share one interpreter lock,
    # so a check on every rank's thread was paid once a rank and held the last rank's launch back.
    def run(self, program: str, vars: dict[str, int], inputs: dict[str, np.ndarray] | None = None,
            wait: bool = True) -> dict[str, int]:  # every rank waits: a read asks rank 0 alone
        step = self.ranks[0].checked(program, vars, inputs)
        return self.workers.each(lambda r: self.ranks[r].run_checked(step))[0]

    def run_steps(self, program: str, vars: dict[str, int], inputs: dict[str, np.ndarray],
                  steps: list[dict[str, np.ndarray]], feedback: dict[str, str],
                  collect: list[str], each=None) -> list[dict[str, np.ndarray]]:
        plan = self.ranks[0].checked_steps(program, vars, inputs, steps, feedback, collect)
        return self.workers.each(lambda r: self.ranks[r].run_checked_steps(plan, each if r == 0 else None))[0]

    def runs_steps_natively(self, program: str) -> bool:
        return self.ranks[0].runs_steps_natively(program)

    def remap_state(self, state: str, unmap: list[int], map: list[tuple[int, int]]) -> None:
        self.workers.each(lambda r: self.ranks[r].remap_state(state, unmap, map))

    def copy_state(self, state: str, dst: int, src: int, nbytes: int) -> None:
        self.workers.each(lambda r: self.ranks[r].copy_state(state, dst, src, nbytes))

    def read_state(self, state: str, offset: int, nbytes: int) -> np.ndarray:
        raise RankError("a split deployment has no host tier: its pages are not parked")

    def write_state(self, state: str, offset: int, data: np.ndarray) -> None:
        raise RankError("a split deployment has no host tier: its pages are not parked")

    # ---- reading: rank 0 (on its own thread, where its device is current) --------------------
    def read(self, buffer: str, env: dict[str, int]) -> np.ndarray:
        return self.workers.on(0, lambda: self.ranks[0].read(buffer, env))

    def read_rows(self, buffer: str, env: dict[str, int], rows: list[int]) -> np.ndarray:
        return self.workers.on(0, lambda: self.ranks[0].read_rows(buffer, env, rows))

    def shape(self, buffer: str, env: dict[str, int]) -> tuple[int, ...]:
        return self.ranks[0].shape(buffer, env)

    def env(self, program: str, vars: dict[str, int]) -> dict[str, int]:
        return self.ranks[0].env(program, vars)

    def domain(self, buffer: str) -> tuple[int, int]:
        return self.ranks[0].domain(buffer)

    def page_bytes(self, state: str) -> int:
        return self.ranks[0].page_bytes(state)


def load_split(v: Verified, weights: str | Path | None, **kw) -> "Engine | RankedEngine":
    """The engine of a split deployment (v: one of its rank manifests, verified). Under a
    launcher (WORLD_SIZE > 1: torchrun, Slurm) this process's rank alone, on GPU LOCAL_RANK,
    joined to the others (kern.world.processes); else every rank, one thread each (RankedEngine)."""
    from .processes import World, join

    world = World.from_env()
    if world is None:
        return RankedEngine(rank_manifests(v), weights, **kw)
    mine = v if v.manifest.topology.rank == world.rank else load_verified(v.base_dir / f"rank{world.rank}.json")
    engine = Engine(mine, weights, device=rank_device(mine, world.local_rank), **kw)
    join(world, engine)
    return engine


def link(ranks: list[Engine], workers: Workers) -> None:
    """What lets the ranks reach each other: on cuda, peer access between every pair of GPUs
    and NCCL communicators where a manifest calls NCCL; then every peer buffer filled with the
    address of its exported buffer on each rank."""
    if ranks[0].device.kind == "cuda":
        from ..runtime.devices.cuda import peer

        ctxs = [e.device.dev for e in ranks]
        workers.each(lambda r: peer.enable(ctxs[r], [c for p, c in enumerate(ctxs) if p != r]))
        if any(l.entry.startswith("extern:nccl_") for ls in ranks[0].launches.values() for l in ls):
            from ..runtime.devices.cuda import nccl

            comms = nccl.init_all([c.ordinal for c in ctxs])
            for e, comm in zip(ranks, comms):
                e.device.communicator = comm
    tables = {name: np.array([address(e.buffers[b.of]) for e in ranks], np.uint64)
              for name, b in ranks[0].m.buffers.items() if b.kind == "peer"}

    def fill(r: int) -> None:
        for name, table in tables.items():
            ranks[r].device.write(ranks[r].buffers[name], table)
        ranks[r].device.synchronize()

    workers.each(fill)
