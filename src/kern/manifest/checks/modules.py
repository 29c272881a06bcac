"""5. modules have a 64-hex sha256 and a well-formed source; every module is used."""

from __future__ import annotations

import re
from collections.abc import Iterator

from ..context import Context
from ..problems import Problem

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_HF = re.compile(r"^hf:[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+/[^@\s]+(@[A-Za-z0-9_.-]+)?$")


def modules(c: Context) -> Iterator[Problem]:
    used = {l.module for op in c.m.ops.values() for l in op.impl.launches}
    for name, mod in c.m.modules.items():
        where = f"modules.{name}"
        if not _HEX64.match(mod.sha256):
            yield Problem(f"{where}.sha256", f"expected 64 lowercase hex digits, got {mod.sha256!r}")
        src = mod.source
        if src.startswith("hf:"):
            if not _HF.match(src):
                yield Problem(f"{where}.source", f"malformed hf source {src!r}: expected hf:org/repo/path[@rev]")
        elif "://" in src:
            if not src.startswith("https://") or len(src) <= len("https://"):
                yield Problem(f"{where}.source", f"only https:// URLs are fetched, got {src!r}")
        elif not src or src.startswith("/") or "\\" in src or ".." in src.split("/"):
            yield Problem(f"{where}.source",
                          f"a path must be relative to the manifest and stay inside its folder, got {src!r}")
        if name not in used and not c.mentioned(name):
            yield Problem(where, "declared and unused (no launch names it)")
