"""The pool's two errors: a caller broke the contract, or the books disagree with themselves."""

from __future__ import annotations

from dataclasses import dataclass

from kern.errors import KernError


class PoolError(KernError, RuntimeError):
    """A caller broke the pool's contract (a lease or checkpoint of another pool or already
    ended, lists that do not pair up, an unknown plan); the message names the object. The
    pool's books are as they were before the call."""


@dataclass(frozen=True, slots=True)
class Violation:
    """One way the books disagree with what the holders say."""

    where: str  # "kv page 12", "lease 7", "chunk 3"
    what: str


class IntegrityError(KernError, AssertionError):
    """The books are broken: a bug in the pool, never the caller's doing. Raised explicitly,
    so it holds under `python -O` too."""

    def __init__(self, violations: list[Violation]) -> None:
        self.violations = violations
        lines = [f"  {p.where}: {p.what}" for p in violations[:50]]
        more = [f"  ... and {len(violations) - 50} more"] if len(violations) > 50 else []
        super().__init__("pool integrity check failed:\n" + "\n".join(lines + more))


def broken(where: str, what: str) -> IntegrityError:
    """An internal invariant failed where it is kept (not reachable through the public API)."""
    return IntegrityError([Violation(where, what)])
