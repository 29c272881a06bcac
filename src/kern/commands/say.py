"""The one line a failed command prints: `kern COMMAND: ...`, a manifest's failure as its first
problem with a pointer to kern verify for the rest (kern bench, cut, kernels)."""

from __future__ import annotations

import sys

from ..manifest.problems import ManifestError


def manifest_line(exc: ManifestError) -> str:
    first = exc.problems[0]
    if len(exc.problems) == 1 and first.what.startswith("cannot read"):
        return str(first)
    more = f" (+{len(exc.problems) - 1} more; kern verify lists them)" if len(exc.problems) > 1 else ""
    what = first.what if first.where == exc.path else str(first)
    return f"{exc.path}: manifest failed verification: {what}{more}"


def failed(command: str, exc: Exception) -> int:
    """`kern COMMAND: <the error>` on stderr, exit 1: a manifest that fails verification as its
    first problem (kern verify lists the rest), any other KernError as its message."""
    print(f"kern {command}: {manifest_line(exc) if isinstance(exc, ManifestError) else exc}", file=sys.stderr)
    return 1
