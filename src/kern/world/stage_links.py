"""What joins a pipelined deployment's stages (kern.world.staged): which device each stage
takes, peer access between them, the hand-over copy of activations, a micro-batch's inputs."""

from __future__ import annotations

import numpy as np

from ..errors import KernError
from ..manifest.verify import Verified
from ..runtime.engine import Engine
from .ranks import Workers


class StageError(KernError):
    """A pipelined deployment cannot be made or run as asked; one line naming why."""


def micro_inputs(inputs: dict[str, np.ndarray], lo: int, hi: int, cu: str | None) -> dict[str, np.ndarray]:
    """Groups [lo, hi) of a step's inputs, each laid out by group; `cu` (a decode program's
    cu_seqlens: 0, 1, .., n) rebased to the micro-batch's first row."""
    return {b: (np.asarray(x)[lo:hi + 1] - np.asarray(x)[lo]) if b == cu else np.asarray(x)[lo:hi]
            for b, x in inputs.items()}


def ordinals(v: Verified, n: int) -> list[int]:
    """Stage k's device: cpu, a CpuDevice of its own; cuda, GPU k (refused where there are fewer)."""
    if v.manifest.target.device == "cuda":
        from ..runtime.devices.cuda.driver import call, open_device

        open_device(0)
        gpus = call("cuDeviceGetCount")
        if gpus < n:
            raise StageError(f"--pp {n}: a stage a GPU needs {n} GPUs, this machine has {gpus}")
    return list(range(n))


def link(stages: list[Engine], workers: Workers) -> None:
    """cuda: peer access between the stages' GPUs (the hand-over copies between them)."""
    if stages[0].device.kind == "cuda" and len({e.device.dev.ordinal for e in stages}) > 1:
        from ..runtime.devices.cuda import peer

        ctxs = [e.device.dev for e in stages]
        workers.each(lambda k: peer.enable(ctxs[k], [c for c in ctxs if c.ordinal != ctxs[k].ordinal]))


def peer_copy(dst: Engine, dst_buf, src: Engine, src_buf, nbytes: int, dst_offset: int = 0) -> None:
    """nbytes from the start of src's buffer (a name, or a storage) into dst's at byte dst_offset,
    on the caller's thread (dst's): cpu, a copy between host arrays; cuda, a peer copy on dst's
    stream (a device copy when both are one GPU), waited for."""
    d = dst.buffers[dst_buf] if isinstance(dst_buf, str) else dst_buf
    s = src.buffers[src_buf] if isinstance(src_buf, str) else src_buf
    if nbytes <= 0:
        return
    if isinstance(d, np.ndarray):
        d.view(np.uint8)[dst_offset:dst_offset + nbytes] = s.view(np.uint8)[:nbytes]
        return
    from ..runtime.devices.cuda.driver import call

    dd, sd = dst.device, src.device
    if dd.dev.ordinal == sd.dev.ordinal:
        call("cuMemcpyDtoDAsync", d.ptr + dst_offset, s.ptr, nbytes, dd.stream.handle, where="pipeline copy")
    else:
        call("cuMemcpyPeerAsync", d.ptr + dst_offset, dd.dev.context, s.ptr, sd.dev.context, nbytes,
             dd.stream.handle, where=f"pipeline peer copy GPU {sd.dev.ordinal} -> {dd.dev.ordinal}")
    dd.synchronize()
