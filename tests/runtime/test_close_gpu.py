"""On the GPU, closing a model gives its device memory back: the driver's free memory after a
close is what it was before the model opened (weights, states, graphs, cuBLASLt's workspace,
pinned slots), so one process can open model after model (tests/runtime/test_close.py holds the
bookkeeping on the CPU)."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.gpu

MIB = 1 << 20


def free_bytes() -> int:
    from kern.runtime.devices.cuda.driver import call, open_device

    ctx = open_device(0)
    call("cuCtxSetCurrent", ctx.context)
    call("cuCtxSynchronize")
    return int(call("cuMemGetInfo")[0])


def test_a_closed_model_leaves_the_device_memory_it_found(tmp_path):
    from kern.api import Model
    from kern.runtime.errors import DeviceError
    from kern_models.common.random_checkpoint import make
    from kern_models.llama.generator import generate

    ckpt = make("smollm2-135m", tmp_path / "ckpt", device="cuda")
    man = generate(json.loads((ckpt / "config.json").read_text()), tmp_path / "deploy", target="cuda",
                   model="smollm2-135m")
    with Model(man, ckpt, state_budget=1 << 30) as first:  # the context's own first-use costs, paid here
        want = first.generate([1, 2, 3, 4], max_tokens=16, temperature=0.0).tokens
    before = free_bytes()
    with Model(man, ckpt, state_budget=1 << 30) as m:
        assert m.generate([1, 2, 3, 4], max_tokens=16, temperature=0.0).tokens == want
        held = before - free_bytes()
    after = free_bytes()
    assert held > 1 << 30, f"the open model held only {held / MIB:.0f} MiB (its 1 GiB of states and the weights)"
    assert after >= before - 16 * MIB, f"{(before - after) / MIB:.0f} MiB not given back of {held / MIB:.0f}"
    with pytest.raises(DeviceError, match="closed"):
        m.generate([1, 2, 3, 4], max_tokens=4, temperature=0.0)
