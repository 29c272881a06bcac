"""Problems: what the verifier reports, each naming its place."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Problem:
    where: str  # "programs.decode.calls[12] (op rms_norm) arg 2"
    what: str  # "expects in buffer<bf16>, got buffer 'logits' of f32"

    def __str__(self) -> str:
        return f"{self.where}: {self.what}" if self.where else self.what


class ManifestError(Exception):
    """A manifest failed to parse or verify; carries every problem found."""

    def __init__(self, path: str, problems: list[Problem]):
        self.path = path
        self.problems = problems
        lines = "\n".join(f"  {p}" for p in problems)
        super().__init__(f"{path}: manifest failed verification:\n{lines}")
