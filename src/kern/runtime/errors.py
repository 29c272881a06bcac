"""The runtime's errors: each says what is wrong, where, and who has to act (a request or step
outside a bound is kern.errors.BoundsError; a module or checkpoint that cannot be read is
kern.files.errors')."""

from ..errors import KernError


class DeviceError(KernError):
    """The device cannot run this manifest (missing driver, library or GPU)."""


class LaunchError(KernError):
    """A launch failed on the device; names the call, the launch and the kernel."""
