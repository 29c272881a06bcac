"""The verifier: run every check, report every problem, or hand out a Verified manifest."""

from __future__ import annotations

import gc
import hashlib
from dataclasses import dataclass
from pathlib import Path

from . import checks
from .context import build
from .limits import MAX_MANIFEST_BYTES
from .load import parse_all
from .schema import Manifest
from .problems import Broken, ManifestError, Problem
from .types import Param

_TOKEN = object()


class Verified:
    """A manifest that passed every check. Only verify() makes one; the runtime takes only this."""

    __slots__ = ("manifest", "constants", "params", "base_dir")

    def __init__(self, manifest: Manifest, constants: dict[str, int], params: dict[str, list[Param]],
                 base_dir: Path, *, _token: object = None):
        if _token is not _TOKEN:
            raise TypeError("a Verified manifest comes only from kern.manifest.verify()")
        self.manifest = manifest
        self.constants = constants
        self.params = params
        self.base_dir = base_dir

    @property
    def launches(self) -> int:
        return sum(len(self.manifest.ops[c.op].impl.launches) for _, c in self.manifest.calls())

    @property
    def ncalls(self) -> int:
        return sum(len(p.calls) for p in self.manifest.programs.values())


@dataclass(frozen=True, slots=True)
class Report:
    verified: Verified | None
    problems: list[Problem]


def check(m: Manifest, base_dir: Path = Path("."), broken: Broken = Broken(),
          schema_problems: list[Problem] | None = None) -> Report:
    """Run every check on a parsed manifest (`broken`: what schema errors left out of it);
    report every problem, schema problems first, then in check order."""
    ctx = build(m, broken)
    problems = [*(schema_problems or ()), *ctx.problems]
    for fn in checks.ALL:
        ctx.problems = []  # checks record expressions that do not resolve here
        try:
            found = list(fn(ctx))
        except Exception as exc:  # a verifier bug must still not hide the other problems
            found = [Problem(f"verifier check {fn.__name__}", f"internal error {type(exc).__name__}: {exc}")]
        problems += ctx.problems + found
    problems = list(dict.fromkeys(problems))
    if problems:
        return Report(None, problems)
    return Report(Verified(m, ctx.consts, ctx.params, base_dir, _token=_TOKEN), [])


def local_pins(m: Manifest, base_dir: Path) -> list[Problem]:
    """Each module file beside the manifest whose bytes no longer hash to its pin (the runtime
    would refuse it at load). Remote modules are checked when fetched; a file not there is the
    load's to report (a manifest may be verified before its kernels are copied beside it)."""
    out = []
    for name, mod in m.modules.items():
        src = mod.source
        if src.startswith("hf:") or "://" in src or src.startswith("/") or ".." in src.split("/"):
            continue  # remote, or a path the modules check refuses
        path = base_dir / src
        if not path.is_file():
            continue
        got = hashlib.sha256(path.read_bytes()).hexdigest()
        if got != mod.sha256:
            out.append(Problem(f"modules.{name}.sha256", f"the file {src} hashes to {got}, not the pinned "
                               f"{mod.sha256}: rebuild it, or pin what it is"))
    return out


def verify_text(text: str | bytes, where: str = "manifest", base_dir: Path = Path("."), *,
                files: bool = False) -> Report:
    """`files`: also check the pins of module files in base_dir (local_pins)."""
    # Parsing makes tens of thousands of acyclic objects (JSON values, typed models); the cycle
    # collector would walk them again and again for nothing (a third of the time on a
    # 64-layer manifest), so it pauses for the duration.
    paused = gc.isenabled()
    gc.disable()
    try:
        p = parse_all(text, where)
        if p.manifest is None:
            return Report(None, p.problems)
        r = check(p.manifest, base_dir, p.broken, p.problems)
        pins = local_pins(p.manifest, base_dir) if files else []
        return Report(None, r.problems + pins) if pins else r
    finally:
        if paused:
            gc.enable()


def verify_path(path: str | Path, *, files: bool = False) -> Report:
    """`files`: also check the pins of the module files beside it (kern verify does; a load
    checks each module's bytes as it fetches them, and kern kernels lists every mismatch)."""
    p = Path(path)
    if p.is_dir():
        p = p / "manifest.json"
    try:
        size = p.stat().st_size
        if size > MAX_MANIFEST_BYTES:
            return Report(None, [Problem(str(p), f"{size} bytes; a manifest is at most {MAX_MANIFEST_BYTES} bytes")])
        data = p.read_bytes()
    except OSError as exc:
        return Report(None, [Problem(str(p), f"cannot read: {exc.strerror or exc}")])
    return verify_text(data, str(p), p.parent, files=files)


def load_verified(path: str | Path) -> Verified:
    """Verify a manifest file or folder; raise ManifestError listing every problem."""
    r = verify_path(path)
    if r.verified is None:
        raise ManifestError(str(path), r.problems)
    return r.verified
