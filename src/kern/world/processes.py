"""One process a rank, started the way the field's launchers start them: torchrun and Slurm set
RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT; this process runs rank RANK of the
split deployment on GPU LOCAL_RANK and meets the others at MASTER_ADDR:MASTER_PORT.

The meeting is one all-gather over TCP (rank 0 listens, every rank sends one JSON blob, rank 0
answers with all of them): its host, the CUDA IPC handles of the buffers it exports, and from
rank 0 the NCCL unique id. Then the communicator is made (ncclCommInitRank) and every peer
table filled: a rank's own address, the others' opened from their IPC handles. Every process
runs the same host loop on the same requests (the scheduler is deterministic), so each steps
the same programs in the same order; rank 0's outputs are the ones a caller reads (every rank
computes the same). The peer all-reduce reads other GPUs' memory, so it needs every rank on one
host; across hosts a manifest's all-reduces are NCCL's (docs/tensor-parallel.md)."""

from __future__ import annotations

import json
import os
import socket
import struct
import time
from dataclasses import dataclass

import numpy as np

from ..errors import KernError

MEET_S = 300.0  # how long a rank waits for the others to arrive


class WorldError(KernError):
    """The launcher's environment or the meeting of the ranks failed; names the variable or peer."""


@dataclass(frozen=True)
class World:
    rank: int
    size: int
    local_rank: int
    master_addr: str
    master_port: int

    @classmethod
    def from_env(cls, env=None) -> "World | None":
        """The launcher's world, or None when WORLD_SIZE is unset or 1 (one process drives every rank)."""
        env = os.environ if env is None else env
        if env.get("WORLD_SIZE") in (None, "", "1"):
            return None

        def whole(name: str, default: str | None = None, lo: int = 0) -> int:
            text = env.get(name, default)
            if text is None:
                raise WorldError(f"WORLD_SIZE is {env['WORLD_SIZE']}, but {name} is not set")
            if not text.strip().isdigit() or int(text) < lo:
                raise WorldError(f"{name}={text!r}: expected a whole number >= {lo}")
            return int(text)

        size = whole("WORLD_SIZE", lo=2)
        rank = whole("RANK")
        if rank >= size:
            raise WorldError(f"RANK={rank}: must be below WORLD_SIZE={size}")
        port = whole("MASTER_PORT", lo=1)
        if port > 65535:
            raise WorldError(f"MASTER_PORT={port}: not a TCP port")
        addr = env.get("MASTER_ADDR")
        if not addr:
            raise WorldError(f"WORLD_SIZE is {size}, but MASTER_ADDR is not set")
        return cls(rank, size, whole("LOCAL_RANK", str(rank)), addr, port)


def _send(sock: socket.socket, data: bytes) -> None:
    sock.sendall(struct.pack("<Q", len(data)) + data)


def _recv(sock: socket.socket) -> bytes:
    def exactly(n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            if not chunk:
                raise WorldError("a rank closed the meeting before it was done")
            buf += chunk
        return buf

    return exactly(struct.unpack("<Q", exactly(8))[0])


def all_gather(world: World, blob: dict, timeout: float = MEET_S) -> list[dict]:
    """Every rank's blob, in rank order, on every rank (rank 0 serves at MASTER_ADDR:MASTER_PORT)."""
    where = f"{world.master_addr}:{world.master_port}"
    if world.rank == 0:
        got = {0: blob}
        with socket.create_server(("", world.master_port), reuse_port=False) as srv:
            srv.settimeout(timeout)
            peers = []
            try:
                while len(got) < world.size:
                    conn, _ = srv.accept()
                    conn.settimeout(timeout)
                    msg = json.loads(_recv(conn))
                    got[int(msg["rank"])] = msg["blob"]
                    peers.append(conn)
            except socket.timeout:
                raise WorldError(f"rank 0 at {where}: {world.size - len(got)} ranks did not arrive in {timeout:.0f} s "
                                 f"(missing {sorted(set(range(world.size)) - set(got))})") from None
            everyone = json.dumps([got[r] for r in range(world.size)]).encode()
            for conn in peers:
                with conn:
                    _send(conn, everyone)
        return [got[r] for r in range(world.size)]
    give_up = time.monotonic() + timeout
    while True:  # rank 0 may not be listening yet: the launcher starts every rank at once
        try:
            with socket.create_connection((world.master_addr, world.master_port), timeout=timeout) as conn:
                _send(conn, json.dumps({"rank": world.rank, "blob": blob}).encode())
                return json.loads(_recv(conn))
        except ConnectionRefusedError as exc:
            if time.monotonic() > give_up:
                raise WorldError(f"rank {world.rank}: cannot meet rank 0 at {where} ({exc.strerror})") from None
            time.sleep(0.1)
        except OSError as exc:
            raise WorldError(f"rank {world.rank}: cannot meet rank 0 at {where} ({exc.strerror or exc})") from None


def join(world: World, engine) -> None:
    """Link this process's rank (a cuda Engine of rank world.rank) to the others: the NCCL
    communicator where the manifest calls NCCL, and every peer table."""
    t = engine.m.topology
    if (t.ranks, t.rank) != (world.size, world.rank):
        raise WorldError(f"the manifest is rank {t.rank} of {t.ranks}, the launcher says RANK={world.rank} of "
                         f"WORLD_SIZE={world.size}")
    if engine.device.kind != "cuda":
        raise WorldError("one process a rank needs cuda: the cpu device runs a split deployment's ranks as threads "
                         "of one process (leave WORLD_SIZE unset)")
    from ..runtime.devices.cuda import ipc, nccl

    peers = {n: b for n, b in engine.m.buffers.items() if b.kind == "peer"}
    uses_nccl = any(l.entry.startswith("extern:nccl_") for ls in engine.launches.values() for l in ls)
    blob = {"host": socket.gethostname(), "ipc": {n: ipc.export(engine.buffers[b.of].ptr) for n, b in peers.items()},
            "nccl": nccl.unique_id().hex() if uses_nccl and world.rank == 0 else None}
    everyone = all_gather(world, blob)
    if uses_nccl:
        engine.device.communicator = nccl.init_rank(world.size, bytes.fromhex(everyone[0]["nccl"]), world.rank)
    if peers:
        away = sorted({e["host"] for e in everyone} - {blob["host"]})
        if away:
            raise WorldError(f"the manifest's peer all-reduce reads the other GPUs' memory, but ranks run on {away} "
                             f"too: split across hosts with NCCL all-reduces only")
    for name in peers:
        table = np.array([engine.buffers[peers[name].of].ptr if r == world.rank else ipc.open(e["ipc"][name])
                          for r, e in enumerate(everyone)], np.uint64)
        engine.device.write(engine.buffers[name], table)
    engine.device.synchronize()

