"""Module fetch: relative path, https:// or hf:org/repo/path[@rev], checked against its sha256
before anything loads it, and kept in a content-addressed cache."""

from __future__ import annotations

import hashlib
import os
import urllib.request
from pathlib import Path

from .errors import ModuleError


def cache_dir() -> Path:
    return Path(os.environ.get("KERN_CACHE") or Path.home() / ".cache" / "kern")


def _url(source: str) -> str:
    if source.startswith("hf:"):
        rest = source[3:]
        rev = "main"
        if "@" in rest:
            rest, rev = rest.rsplit("@", 1)
        org, repo, path = rest.split("/", 2)
        return f"https://huggingface.co/{org}/{repo}/resolve/{rev}/{path}"
    return source


def fetch(name: str, source: str, sha256: str, base_dir: Path) -> bytes:
    """The module's bytes, verified. Raises ModuleError naming the module and both hashes."""
    blob = cache_dir() / "blobs" / sha256
    if source.startswith(("https://", "hf:")):
        if blob.is_file():
            data = blob.read_bytes()
            if hashlib.sha256(data).hexdigest() == sha256:
                return data
        try:
            with urllib.request.urlopen(_url(source), timeout=60) as r:  # noqa: S310 (https only)
                data = r.read()
        except OSError as exc:
            raise ModuleError(f"module {name!r}: cannot fetch {source}: {exc}") from None
    else:
        path = base_dir / source
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ModuleError(f"module {name!r}: cannot read {path}: {exc.strerror or exc}") from None
    got = hashlib.sha256(data).hexdigest()
    if got != sha256:
        raise ModuleError(f"module {name!r} ({source}): sha256 mismatch, refused before load: "
                          f"manifest pins {sha256}, the bytes hash to {got}")
    if source.startswith(("https://", "hf:")):
        blob.parent.mkdir(parents=True, exist_ok=True)
        tmp = blob.with_suffix(".tmp")
        tmp.write_bytes(data)
        tmp.replace(blob)
    return data
