"""Runtime errors: each says what is wrong, where, and who has to act."""

from ..errors import KernError


class ModuleError(KernError):
    """A module cannot be fetched, or its bytes do not match the pinned sha256."""


class WeightError(KernError):
    """Checkpoint tensors are missing or mis-shaped; lists each."""


class BoundsError(KernError):
    """A step outside a var bound or an input outside its domain, refused before launch."""


class DeviceError(KernError):
    """The device cannot run this manifest (missing driver, library or GPU)."""


class LaunchError(KernError):
    """A launch failed on the device; names the call, the launch and the kernel."""
