"""The peer-memory all-reduce for the cpu device: the sm_90a kernel (cuda/collectives/
allreduce.cu) in numpy, so that CI runs tensor parallelism end to end without a GPU.

This file is a kern module, pinned by sha256. The cpu device runs each rank on a thread of one
process, so a peer buffer's addresses (a u64 per rank, filled in by kern.world.ranks) are
plain host addresses that every rank can read. The algorithm is the GPU kernel's: bump the
epoch, write it into every rank's flag slot of this rank, wait until every rank's flag in this
rank's slots has reached it, then sum every rank's part in rank order (the same bits on every
rank) into y; the all-gather of a vocabulary-sharded LM head's logits crosses the same barrier,
then copies every rank's slice into place."""

import ctypes
import time

import numpy as np

WAIT_S = 120.0  # a rank that never arrives (it failed): an error rather than a hang


def _at(address, dtype, n):
    return np.frombuffer((ctypes.c_char * (n * np.dtype(dtype).itemsize)).from_address(int(address)), dtype)


def _barrier(parts, flag_peers, flags, epoch, rank, ranks):
    if not (parts.all() and flag_peers.all()):
        raise ValueError("the peer tables are empty: a split deployment's ranks load together "
                         "(kern.world.ranks), not one rank alone")
    e = int(epoch[0]) + 1
    epoch[0] = e
    for p in range(ranks):
        _at(flag_peers[p], np.uint32, ranks)[rank] = e
    give_up = time.monotonic() + WAIT_S
    while int(flags.reshape(-1)[:ranks].min()) < e:
        if time.monotonic() > give_up:
            raise TimeoutError(f"rank {rank}: the other ranks did not reach collective {e} in {WAIT_S:.0f} s")
        time.sleep(1e-4)  # let the other ranks run (one process, one GIL)


def all_reduce_sum(parts, flag_peers, flags, epoch, y, rank, ranks, offset, n):
    _barrier(parts, flag_peers, flags, epoch, rank, ranks)
    acc = np.zeros(n, np.float32)
    for p in range(ranks):
        acc += _at(parts[p], np.float32, offset + n)[offset:]
    y.reshape(-1)[:] = acc


def all_gather(parts, flag_peers, flags, epoch, y, rank, ranks, rows, width):
    """y[r, p * width + j] = parts[p][r, j]: the vocabulary-sharded LM head's logits, every
    rank's slice on every rank."""
    _barrier(parts, flag_peers, flags, epoch, rank, ranks)
    out = y.reshape(-1)[:rows * ranks * width].reshape(rows, ranks, width)
    for p in range(ranks):
        out[:, p, :] = _at(parts[p], np.float32, rows * width).reshape(rows, width)


def dispatch_rows(parts, flag_peers, flags, epoch, x, ids, recv, rank, ranks, per_rank):
    """The all-to-all that sends rows to the ranks that own them (expert parallel's dispatch):
    row t is sent from its home rank (t % ranks) to every rank owning one of its ids[t]
    (id // per_rank), into row t of that rank's exported buffer (recv, here)."""
    rows, width = x.shape
    for t in range(rank, rows, ranks):
        for p in sorted({int(i) // per_rank for i in ids[t]}):
            dst = recv if p == rank else _at(parts[p], np.float32, rows * width).reshape(rows, width)
            dst[t] = x[t]
    _barrier(parts, flag_peers, flags, epoch, rank, ranks)


def combine_rows(parts, flag_peers, flags, epoch, y, ids, weights, out, rank, ranks, per_rank):
    """The all-to-all that brings the owners' results back (expert parallel's combine): each
    rank writes y[t, j] for the ids it owns into every rank's exported [rows, k, width] buffer,
    then every rank sums its row t over j with weights[t, j], in j order (the single device's
    order: the same bits)."""
    rows, k, width = y.shape
    t, j = np.nonzero(ids // per_rank == rank)
    for p in range(ranks):
        _at(parts[p], np.float32, rows * k * width).reshape(rows, k, width)[t, j] = y[t, j]
    _barrier(parts, flag_peers, flags, epoch, rank, ranks)
    got = _at(parts[rank], np.float32, rows * k * width).reshape(rows, k, width)
    out[:] = 0
    for i in range(k):
        out += weights[:, i:i + 1] * got[:, i]
