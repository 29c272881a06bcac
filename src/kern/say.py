"""One-line messages for the commands (kern bench, cut, kernels): a manifest's failure as its
first problem, with a pointer to kern verify for the rest."""

from __future__ import annotations

from .manifest.problems import ManifestError


def manifest_line(exc: ManifestError) -> str:
    first = exc.problems[0]
    if len(exc.problems) == 1 and first.what.startswith("cannot read"):
        return str(first)
    more = f" (+{len(exc.problems) - 1} more; kern verify lists them)" if len(exc.problems) > 1 else ""
    what = first.what if first.where == exc.path else str(first)
    return f"{exc.path}: manifest failed verification: {what}{more}"
