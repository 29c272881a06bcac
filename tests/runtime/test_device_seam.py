"""The engine meets a device only through kern.runtime.device's Device and Program protocols:
both devices implement every member with the protocol's parameters, declare whether run_steps
runs on the device, and report failures as KernErrors. Checked without a GPU (the cuda
modules import without cuda-bindings)."""

from __future__ import annotations

import inspect

import pytest

from kern.runtime import device as seam
from kern.runtime.devices.cpu import CpuDevice, CpuProgram
from kern.runtime.devices.cuda import CudaError, CudaUnavailable, ParamLayoutError
from kern.runtime.devices.cuda.device import CudaDevice, CudaProgram
from kern.runtime.errors import KernError


def members(proto: type) -> dict[str, object]:
    """The protocol's methods and declared attributes, by name."""
    own = {n: v for n, v in vars(proto).items() if not n.startswith("_")}
    return {**own, **{n: None for n in getattr(proto, "__annotations__", {})}}


def mismatches(impl: type, proto: type) -> list[str]:
    out = []
    for name, want in members(proto).items():
        if not hasattr(impl, name):
            out.append(f"{impl.__name__} has no {name}")
        elif callable(want):
            got = getattr(impl, name)
            if not callable(got):
                out.append(f"{impl.__name__}.{name} is not a method")
            elif list(inspect.signature(got).parameters) != list(inspect.signature(want).parameters):
                out.append(f"{impl.__name__}.{name}{inspect.signature(got)} differs from the protocol's "
                           f"{inspect.signature(want)}")
    return out


@pytest.mark.parametrize("impl,proto", [(CpuDevice, seam.Device), (CudaDevice, seam.Device),
                                        (CpuProgram, seam.Program), (CudaProgram, seam.Program)])
def test_each_device_implements_the_protocol(impl, proto):
    assert mismatches(impl, proto) == []


def test_the_check_finds_a_missing_or_different_member():
    class Half:
        runs_steps_natively = True

        def run(self, env, extra):
            pass

    assert mismatches(Half, seam.Program) == [
        "Half.run(self, env, extra) differs from the protocol's (self, env: 'dict[str, int]', wait: 'bool' = True) "
        "-> 'None'",
        "Half has no run_steps"]


def test_run_steps_is_a_declared_capability():
    """The cpu loops single steps on the host (running ahead saves nothing there); cuda enqueues
    every step before the host waits."""
    assert CpuProgram.runs_steps_natively is False
    assert CudaProgram.runs_steps_natively is True


@pytest.mark.parametrize("error", [CudaUnavailable, CudaError, ParamLayoutError])
def test_cuda_failures_are_kern_errors(error):
    assert issubclass(error, KernError)
