"""Where an engine's memory comes from: the device a manifest targets, the state memory the
budget holds (each state's bytes, or the pool's layout of virtual ranges of chunks), and an
allocation the device cannot give refused naming the buffer. Engine._load places with these."""

from __future__ import annotations

from ..manifest.expr import evaluate
from ..manifest.verify import Verified
from ..pool import Pool
from .device import Device
from .errors import DeviceError
from .paging import plan_pool


def make_device(v: Verified) -> Device:
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


def alloc_named(where: str, nbytes: int, alloc, *args, **kw):
    """`alloc(*args, **kw)`; memory the device cannot give is a DeviceError naming the buffer."""
    try:
        return alloc(*args, **kw)
    except MemoryError:
        raise DeviceError(f"{where}: the device cannot allocate its {nbytes} bytes "
                          f"({nbytes / 2**30:.1f} GiB)") from None


def pool_for(engine, budget: int, host_bytes: int) -> Pool:
    """The pool the engine's paged states share: one page size for all of them."""
    page_tokens = set(engine.protocol.paged_states.values())
    if len(page_tokens) != 1:
        raise DeviceError(f"paging needs one page size for every paged state; the manifest's page tables give "
                          f"{sorted(page_tokens)}")
    return plan_pool(engine.v, page_tokens.pop(), budget, engine.device.chunk_granularity, host_bytes)


def alloc_states(engine, budget: int, sizes: dict[str, int], chunk_bytes: int | None):
    """Each state's memory on the engine's device: `sizes[name]` bytes when given (the pool's
    layout: a virtual range of `chunk_bytes` chunks that the pool's plans map), else what the
    budget holds (pages of a paged state, slots of a per-sequence state), fully backed. Returns
    (states, pages a paged state holds, slots a per-sequence state holds, each state's unit bytes)."""
    states, pages, slots, state_bytes = {}, {}, {}, {}
    paged = engine.protocol.paged_states
    for name, st in engine.m.states.items():
        if st.bytes_per_token is not None:
            per_page = evaluate(st.bytes_per_token, engine.consts) * max(paged.get(name, 1), 1)
            size = sizes.get(name, max(budget // per_page, 1) * per_page)
            pages[name] = size // per_page
            state_bytes[name] = per_page
        elif st.bytes_per_seq is not None:
            per = evaluate(st.bytes_per_seq, engine.consts)
            size = sizes.get(name, max(budget // per, 1) * per)
            slots[name] = size // per
            state_bytes[name] = per
        else:
            size = evaluate(st.bytes, engine.consts)
            state_bytes[name] = size
        chunked = chunk_bytes if name in sizes and st.bytes is None else None
        states[name] = alloc_named(f"states.{name}", size, engine.device.alloc_state, size, chunk_bytes=chunked)
    return states, pages, slots, state_bytes
