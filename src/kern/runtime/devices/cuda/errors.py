"""Errors of the CUDA device, in the KernError family. Each says what failed, where, and who has
to act."""

from kern.files.errors import ModuleError
from kern.runtime.errors import DeviceError


class CudaUnavailable(DeviceError):
    """This machine cannot run CUDA: no bindings, no driver or no GPU (the message says which)."""


class CudaError(DeviceError):
    """A driver or library call failed: names the call, the code and the object it acted on."""

    def __init__(self, call: str, code: int, name: str, where: str = ""):
        self.call, self.code, self.name, self.where = call, code, name, where
        at = f" ({where})" if where else ""
        super().__init__(f"{call} failed with {name} [{code}]{at}")


class ParamLayoutError(ModuleError):
    """A kernel's parameters in the cubin differ from its declared parameter kinds."""
