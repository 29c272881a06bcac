"""Closing gives the device memory back. kern frees a device allocation only by name (nothing
is freed when a Python object is dropped), so an engine that is done must say so: Engine.close,
Model.close, or `with`. On the CPU the engine refuses to step once closed; the CUDA device's
bookkeeping is checked here against a recording stand-in for the driver: every allocation
released once, ranges unmapped before the chunks they map are released, the stream last."""

from __future__ import annotations

import ctypes
from types import SimpleNamespace
from unittest import mock

import numpy as np
import pytest

from kern.api import Model
from kern.runtime.errors import DeviceError


def test_a_closed_model_refuses_to_generate_in_one_line(tiny):
    ckpt, manifest = tiny
    with Model(manifest, ckpt) as m:
        before = m.generate([1, 2, 3], max_tokens=4, temperature=0.0).tokens
    assert m.engine.closed
    with pytest.raises(DeviceError, match="closed") as err:
        m.generate([1, 2, 3], max_tokens=4, temperature=0.0)
    assert "\n" not in str(err.value)
    # Every engine call that touches device memory refuses, not only a step: a cached prompt's
    # page copy comes before the step (on the GPU that copy once read freed memory).
    e = m.engine
    state = next(iter(e.states))
    for call in (lambda: e.copy_state(state, 0, 64, 64), lambda: e.read_state(state, 0, 64),
                 lambda: e.write_state(state, 0, np.zeros(64, np.uint8)), lambda: e.remap_state(state, [0], []),
                 lambda: e.read(next(iter(e.buffers)), {})):
        with pytest.raises(DeviceError, match="closed"):
            call()
    m.close()  # a second close is nothing
    with Model(manifest, ckpt) as again:  # what the first held is not needed by the next
        assert again.generate([1, 2, 3], max_tokens=4, temperature=0.0).tokens == before


class Driver:
    """The calls CudaDevice makes, answered without a GPU and recorded in order."""

    def __init__(self):
        self.log: list[tuple[str, int]] = []
        self.live: dict[str, set[int]] = {"device": set(), "pinned": set(), "range": set(), "chunk": set(),
                                          "mapped": set(), "module": set(), "graph": set(), "stream": set()}
        self.host: dict[int, ctypes.Array] = {}  # pinned memory: real, numpy views it
        self.next = 0x1000

    def _new(self, kind: str, stride: int = 0x1000) -> int:
        self.next += stride
        self.live[kind].add(self.next)
        return self.next

    def _gone(self, kind: str, h: int, name: str) -> None:
        assert h in self.live[kind], f"{name} of {h:#x}: not live (freed twice, or never made)"
        self.live[kind].discard(h)
        self.log.append((name, h))

    def __call__(self, name: str, *args, where: str = ""):
        if name == "cuMemAlloc":
            return self._new("device")
        if name == "cuMemFree":
            return self._gone("device", args[0], name)
        if name == "cuMemHostAlloc":
            buf = ctypes.create_string_buffer(args[0])
            self.host[ctypes.addressof(buf)] = buf
            self.live["pinned"].add(ctypes.addressof(buf))
            return ctypes.addressof(buf)
        if name == "cuMemFreeHost":
            return self._gone("pinned", args[0], name)
        if name == "cuMemAddressReserve":
            return self._new("range", stride=1 << 36)  # apart: a range's slots are its base + k chunks
        if name == "cuMemAddressFree":
            assert not any(args[0] <= at < args[0] + args[1] for at, _ in self.live["mapped"]), \
                "a range freed while mapped"
            return self._gone("range", args[0], name)
        if name == "cuMemCreate":
            return self._new("chunk")
        if name == "cuMemRelease":
            assert not any(c == args[0] for _, c in self.live["mapped"]), "a chunk released while mapped"
            return self._gone("chunk", args[0], name)
        if name == "cuMemMap":
            self.live["mapped"].add((args[0], args[3]))
            return None
        if name == "cuMemUnmap":
            hit = [m for m in self.live["mapped"] if m[0] == args[0]]
            assert len(hit) == 1, f"unmap of {args[0]:#x}: not mapped"
            self.live["mapped"].discard(hit[0])
            self.log.append((name, args[0]))
            return None
        if name == "cuModuleLoadData":
            return self._new("module")
        if name == "cuModuleUnload":
            return self._gone("module", args[0], name)
        if name == "cuStreamCreate":
            return self._new("stream")
        if name == "cuStreamDestroy":
            return self._gone("stream", args[0], name)
        if name == "cuMemGetAllocationGranularity":
            return 2 << 20
        return None  # memset, set access, synchronize, set current: nothing to keep


@pytest.fixture
def driver(monkeypatch):
    from kern.runtime.devices.cuda import (
        device,
        graphs,
        launch,
        memory,
        program,
        tensormap,
        vmm,
    )
    from kern.runtime.devices.cuda import driver as drvmod

    d = Driver()
    for mod in (device, program, memory, vmm, graphs, launch, tensormap):
        monkeypatch.setattr(mod, "call", d, raising=False)
    fake = mock.MagicMock()  # the bindings' enums and structs: any attribute, any value
    for mod in (device, program, memory, vmm, graphs, drvmod):
        monkeypatch.setattr(mod, "drv", lambda: fake, raising=False)
    dev = SimpleNamespace(name="stand-in", compute_capability=(9, 0), context=object(), ordinal=0)
    monkeypatch.setattr(drvmod, "open_device", lambda ordinal: dev)
    return d


def test_a_cuda_device_gives_back_everything_it_made_once(driver):
    from kern.runtime.devices.cuda.device import CudaDevice

    dev = CudaDevice(arch="sm_90a")
    dev.load_module("m", b"\0" * 16)
    plain, staged = dev.alloc("bf16", 1024), dev.alloc("i32", 64, staged=True)
    granule = dev.chunk_granularity
    a, b = dev.alloc_state(4 * granule, chunk_bytes=granule), dev.alloc_state(4 * granule, chunk_bytes=granule)
    dev.remap(a, unmap=[], map=[(0, 0), (1, 1)])
    dev.remap(b, unmap=[], map=[(2, 3)])
    whole = dev.alloc_state(4096)
    program = dev.lower([], {"x": plain}, {"s": whole}, graph=False)
    program._slot(("x",), 0, 64)  # a pinned slot, as run_steps makes them
    live = {k: set(v) for k, v in driver.live.items()}
    assert live["device"] >= {plain.ptr, staged.ptr, whole.ptr} and len(live["chunk"]) == 4
    assert len(live["mapped"]) == 3 and len(live["range"]) == 2 and live["pinned"]

    dev.close()
    left = {k: v for k, v in driver.live.items() if v}
    assert left == {}, f"still held after close: {left}"
    names = [n for n, _ in driver.log]
    assert names[-1] == "cuStreamDestroy"
    assert max(i for i, n in enumerate(names) if n == "cuMemUnmap") < min(
        i for i, n in enumerate(names) if n == "cuMemRelease")
    n = len(driver.log)
    dev.close()
    assert len(driver.log) == n, "a second close released something again"
    with pytest.raises(DeviceError, match="closed"):
        dev.alloc("bf16", 8)
    with pytest.raises(DeviceError, match="closed"):
        dev.alloc_state(4096)


def test_a_load_that_fails_gives_back_what_it_took(tiny, monkeypatch):
    from kern.manifest import load_verified
    from kern.runtime import engine

    made = []
    real = engine.make_device
    monkeypatch.setattr(engine, "make_device", lambda v: made.append(real(v)) or made[-1])
    _, manifest = tiny
    with pytest.raises(DeviceError, match="give the checkpoint folder"):
        engine.Engine(load_verified(manifest), None)  # its modules loaded, then no weights
    assert len(made) == 1 and made[0].closed


@pytest.mark.parametrize("split", ["tp", "pp"])
def test_a_split_load_that_fails_on_one_part_gives_back_every_part_s_memory(tmp_path, monkeypatch, split):
    """The second rank's (tp) or stage's (pp) engine fails (its weights damaged, say): the first's,
    which loaded, is closed and both devices given back before the error reaches the caller (they
    used to stay held)."""
    from kern_models.llama.generator import generate

    from kern.manifest import load_verified
    from kern.world import ranks, staged
    from tests.tp.test_split_manifests import LLAMA

    devices, real_device = [], ranks.rank_device
    monkeypatch.setattr(ranks, "rank_device", lambda v, o: devices.append(real_device(v, o)) or devices[-1])

    class Loaded:  # the first part's engine, as far as closing goes
        def __init__(self, device):
            self.device, self.closed = device, False

        def close(self):
            self.closed = True

    loaded = []

    def engine(v, weights, *, device, **kw):
        if device is not devices[0]:
            raise DeviceError("part 1: planted")
        loaded.append(Loaded(device))
        return loaded[-1]

    monkeypatch.setattr(ranks, "Engine", engine)
    with pytest.raises(DeviceError, match="part 1: planted"):
        if split == "tp":
            generate(LLAMA, tmp_path, target="cpu", tp=2)
            ranks.RankedEngine(ranks.rank_manifests(tmp_path / "rank0.json"), None)
        else:
            staged.StagedEngine(load_verified(generate(LLAMA, tmp_path, target="cpu")), None, 2)
    assert len(devices) == 2 and all(d.closed for d in devices)
    assert len(loaded) == 1 and loaded[0].closed
