"""The errors of reading what a deployment and a checkpoint ship: each says what is wrong,
where, and who has to act."""

from ..errors import KernError


class ModuleError(KernError):
    """A module cannot be fetched, or its bytes do not match the pinned sha256."""


class WeightError(KernError):
    """Checkpoint tensors are missing or mis-shaped; lists each."""
