"""Problems: what the verifier reports, each naming its place."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import KernError


@dataclass(frozen=True, slots=True)
class Problem:
    where: str  # "programs.decode.calls[12] (op rms_norm) arg 2"
    what: str  # "expects in buffer<bf16>, got buffer 'logits' of f32"

    def __str__(self) -> str:
        return f"{self.where}: {self.what}" if self.where else self.what


@dataclass(frozen=True, slots=True)
class OverBudget(Problem):
    """What a deployment allocates at load outgrows its device's memory. `need` says how much
    against which budget, without `what`'s list of the largest allocations: an option that sized
    the deployment (kern's --step-tokens) is named with it instead of a buffer."""
    need: str = ""


class ManifestError(KernError):
    """A manifest failed to parse or verify; carries every problem found."""

    def __init__(self, path: str, problems: list[Problem]):
        self.path = path
        self.problems = problems
        lines = "\n".join(f"  {p}" for p in problems)
        super().__init__(f"{path}: manifest failed verification:\n{lines}")


@dataclass(frozen=True)
class Broken:
    """What schema errors left out of a partly parsed manifest, so that the semantic checks run
    on the rest and stay quiet about what they cannot see (a call naming a buffer whose entry
    did not parse is not "no buffer named ...")."""

    entries: frozenset[str] = frozenset()  # "buffers.d_x", "programs.decode", "target"
    calls: frozenset[tuple[str, int]] = frozenset()  # (program, index) of calls that did not parse
    mentions: frozenset[str] = frozenset()  # every string inside what did not parse

    def has(self, section: str, name: str) -> bool:
        return f"{section}.{name}" in self.entries

    def has_field(self, field: str) -> bool:
        return field in self.entries

    def has_section(self, section: str) -> bool:
        return section in self.entries or any(e.startswith(section + ".") for e in self.entries) or (
            section == "programs" and bool(self.calls))

    def calls_of(self, program: str) -> bool:
        return any(p == program for p, _ in self.calls)
