"""Module fetch: relative path, https:// or hf:org/repo/path[@rev], checked against its sha256
before anything loads it, and kept in a content-addressed cache.

A download streams into a temporary file beside the cache entry, is hashed as it arrives, and is
renamed into place only when it is complete and its sha256 is the pinned one: an interrupted,
truncated or wrong download is never cached, so the next load fetches again."""

from __future__ import annotations

import hashlib
import http.client
import os
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

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


def _remote(source: str) -> bool:
    # The verifier admits only https:// and hf: in a manifest; plain http is fetched here too so
    # that the download path can be tested against a loopback server.
    return source.startswith("hf:") or urlsplit(source).scheme in ("http", "https")


def _mismatch(name: str, source: str, sha256: str, got: str) -> ModuleError:
    return ModuleError(f"module {name!r} ({source}): sha256 mismatch, refused before load: "
                       f"manifest pins {sha256}, the bytes hash to {got}")


def _download(name: str, source: str, sha256: str, blob: Path) -> bytes:
    blob.parent.mkdir(parents=True, exist_ok=True)
    fd, part = tempfile.mkstemp(dir=blob.parent, prefix=f".{sha256[:16]}-", suffix=".part")
    try:
        digest, chunks = hashlib.sha256(), []
        try:
            with os.fdopen(fd, "wb") as out, urllib.request.urlopen(_url(source), timeout=60) as r:  # noqa: S310
                length = r.headers.get("Content-Length")
                while chunk := r.read(1 << 20):
                    digest.update(chunk)
                    chunks.append(chunk)
                    out.write(chunk)
        except urllib.error.HTTPError as exc:
            raise ModuleError(f"module {name!r}: cannot fetch {source}: HTTP {exc.code} {exc.reason}") from None
        except urllib.error.URLError as exc:
            raise ModuleError(f"module {name!r}: cannot fetch {source}: {exc.reason}") from None
        except http.client.IncompleteRead:
            raise ModuleError(f"module {name!r}: cannot fetch {source}: the download was cut off") from None
        except (OSError, http.client.HTTPException) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or type(exc).__name__
            raise ModuleError(f"module {name!r}: cannot fetch {source}: {why}") from None
        data = b"".join(chunks)
        if length is not None and length.isdigit() and int(length) != len(data):
            raise ModuleError(f"module {name!r}: cannot fetch {source}: the download was cut off "
                              f"({len(data)} of {length} bytes)")
        if digest.hexdigest() != sha256:
            raise _mismatch(name, source, sha256, digest.hexdigest())
        os.replace(part, blob)
        return data
    finally:
        Path(part).unlink(missing_ok=True)


def fetch(name: str, source: str, sha256: str, base_dir: Path) -> bytes:
    """The module's bytes, verified. Raises ModuleError naming the module and both hashes."""
    if _remote(source):
        blob = cache_dir() / "blobs" / sha256
        try:
            data = blob.read_bytes()
        except OSError:
            data = None
        if data is not None and hashlib.sha256(data).hexdigest() == sha256:
            return data
        return _download(name, source, sha256, blob)  # a damaged cache entry is fetched again
    path = base_dir / source
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ModuleError(f"module {name!r}: cannot read {path}: {exc.strerror or exc}") from None
    got = hashlib.sha256(data).hexdigest()
    if got != sha256:
        raise _mismatch(name, source, sha256, got)
    return data
