"""The runtime's part of a persistent kernel, without a GPU: pointers buffers are filled with
the addresses of what they name, in order; a table too small for its entries and a cooperative
grid that cannot be co-resident are each one line naming the place, before anything launches."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kern.manifest import load_verified
from kern.runtime.devices.cpu import CpuDevice
from kern.runtime.devices.cuda.cooperative import coresident_problem
from kern.runtime.errors import DeviceError
from kern.runtime.pointers import fill_pointers, pointer_tables
from kern_models.llama.generator import generate

from .test_mega_manifest import TINY


def _tables(manifest_path):
    v = load_verified(manifest_path)
    shapes = {n: (64,) if b.kind == "pointers" else (1,) for n, b in v.manifest.buffers.items()}
    for n, b in v.manifest.buffers.items():
        if b.kind == "pointers":
            shapes[n] = (len(b.entries),)
    return v, shapes


def test_a_pointers_buffer_holds_each_entrys_address_in_order(tmp_path):
    v, shapes = _tables(generate(TINY, tmp_path, target="mega", model="tiny"))
    tables = pointer_tables(v.manifest, shapes)
    (name,) = tables
    dev = CpuDevice()
    storage = {e: dev.alloc("bf16", 8) for e in tables[name]}
    written = {}
    fill_pointers(tables, lambda e: dev.address(storage[e]), lambda n, t: written.__setitem__(n, t))
    assert written[name].dtype == np.uint64
    assert written[name].tolist() == [storage[e].ctypes.data for e in tables[name]]
    assert len(set(written[name].tolist())) == len(tables[name])


def test_a_pointers_buffer_too_small_for_its_entries_is_one_line(tmp_path):
    path = generate(TINY, tmp_path, target="mega", model="tiny")
    m = json.loads(path.read_text())
    m["buffers"]["mega_weights"]["shape"] = [3]
    path.write_text(json.dumps(m))
    v = load_verified(path)
    shapes = {n: (3,) for n in v.manifest.buffers}
    with pytest.raises(DeviceError, match=r"^buffers.mega_weights: a pointers buffer of 3 addresses cannot hold "
                                          r"its 15 entries$"):
        pointer_tables(v.manifest, shapes)


@pytest.mark.parametrize("blocks, per_sm, sms, ok", [
    (132, 1, 132, True),      # one block a multiprocessor: the megakernel's grid on an H200
    (133, 1, 132, False),     # one too many: the barrier would wait forever on a block never started
    (264, 2, 132, True),
    (1, 0, 132, False),       # a block that fits nowhere (too many registers or too much shared memory)
])
def test_a_cooperative_grid_must_be_co_resident(blocks, per_sm, sms, ok):
    why = coresident_problem("module 'mega' kernel 'mega_decode'", blocks, per_sm, sms, "NVIDIA H200")
    assert (why is None) == ok
    if not ok:
        assert why.startswith(f"module 'mega' kernel 'mega_decode': a cooperative grid of {blocks} blocks cannot be "
                              "co-resident on NVIDIA H200")
        assert "\n" not in why
