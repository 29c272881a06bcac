"""Where models come from, without naming any: the default model and the generators are found
through entry points (kern.default_model, kern.generators) that model packages provide.

Generated deployments are cached under `$KERN_CACHE/deployments/`, one folder per checkpoint
config, target and generator source. A folder is built under a `.build-*` name and renamed into
place when complete, so a concurrent `kern run` sees either no deployment or a finished one; a
finished one is reused as it is (never regenerated, never rebuilt by nvcc)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import socket
import tempfile
import time
from functools import cache
from pathlib import Path

from .files.jsonfiles import read_object
from .errors import KernError
from .files.modules import cache_dir

STALE_BUILD_S = 3600  # a .build-* folder this old is abandoned even if its owner's pid lives on


def _entry_points(group: str):
    from importlib.metadata import entry_points

    return list(entry_points(group=group))


def generators() -> list:
    """Every installed generator (the kern.generators entry points), in their order."""
    return [ep.load() for ep in _entry_points("kern.generators")]


def default_model(progress: bool = True) -> Path:
    eps = _entry_points("kern.default_model")
    if not eps:
        raise KernError("no default model is installed (entry point group kern.default_model is empty); "
                        "give a model folder")
    try:
        return Path(eps[0].load()(progress=progress))
    except (RuntimeError, OSError, ValueError) as exc:  # the model package says why it cannot provide it
        raise KernError(f"the default model ({eps[0].value}) is not available: {exc}") from None


@cache
def _source_digest(module: str) -> str:
    """sha256 over the files of the package that holds `module`: a changed generator or kernel
    source makes a new deployment key, so a cached deployment is never stale."""
    spec = importlib.util.find_spec(module.split(".")[0])
    if spec is None:
        return "none"
    roots = list(spec.submodule_search_locations or [Path(spec.origin).parent])
    h = hashlib.sha256()
    for root in map(Path, roots):
        for p in sorted(root.rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts:
                h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def _owner_gone(build: Path) -> bool:
    """A `.build-<host>-<pid>-*` folder whose process has died (or that is old) is abandoned."""
    try:
        age = time.time() - build.stat().st_mtime
    except FileNotFoundError:
        return False
    if age > STALE_BUILD_S:
        return True
    parts = build.name.split("-")
    if len(parts) < 4 or parts[1] != socket.gethostname().replace("-", "_") or not parts[2].isdigit():
        return False
    try:
        os.kill(int(parts[2]), 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


def _clean_abandoned(root: Path) -> None:
    for build in root.glob(".build-*"):
        if _owner_gone(build):
            shutil.rmtree(build, ignore_errors=True)


def _build(gen, config: dict, root: Path, final: Path, target: str, model: str, options: dict) -> Path:
    """Generate into a fresh .build-* folder and rename it to `final`; when another process
    finished first, keep its folder and drop ours."""
    root.mkdir(parents=True, exist_ok=True)
    _clean_abandoned(root)
    host = socket.gethostname().replace("-", "_")
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".build-{host}-{os.getpid()}-"))
    try:
        manifest = gen.generate(config, tmp, target=target, model=model, **options)
        rel = Path(manifest).relative_to(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / rel).is_file():
                raise
        return final / rel
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def refuse_faster_build(given: str, batch_invariant: bool, instead: str) -> None:
    """The one refusal of --no-batch-invariance beside a manifest the user gave (a manifest's
    programs are what they are; the option chooses a generated deployment's): `given` says
    where the manifest came from, `instead` what to do."""
    if not batch_invariant:
        raise KernError(f"{given}; --no-batch-invariance chooses a generated deployment's programs ({instead})")


def refuse_step_tokens(given: str, step_tokens: int | None, instead: str) -> None:
    """The one refusal of --step-tokens beside a manifest the user gave: its prefill rows are
    what they are; the option sizes a generated deployment's."""
    if step_tokens is not None:
        raise KernError(f"{given}; --step-tokens {step_tokens} sizes a generated deployment's prefill steps ({instead})")


def deployment_for(checkpoint: Path, target: str, context: int | None = None, tp: int = 1, ep: int = 1,
                   batch_invariant: bool = True, step_tokens: int | None = None) -> Path:
    """The manifest for a checkpoint folder: its own manifest.json, else one generated by the
    generator that accepts its config.json (found through the kern.generators entry points),
    for sequences of up to `context` positions (None: the generator's default). tp > 1 (tensor
    parallel) or ep > 1 (expert parallel): a split deployment of one manifest a rank; the path
    is rank 0's (rank0.json). Whether a model splits so is its generator's to say.
    batch_invariant=False: the generator's faster build whose bytes depend on the batch
    (its `batch_invariant=False`); a generator whose only build for the target is batch-invariant (every
    cpu build) refuses it in one line naming its family, as it refuses any option it cannot honour.
    step_tokens: the most prompt tokens a step feeds (the generator's `tokens`: its ragged
    programs' rows; None: the generator's default)."""
    split = {k: n for k, n in (("tp", tp), ("ep", ep)) if n != 1}
    if (checkpoint / "manifest.json").is_file():
        if split:
            flags = " ".join(f"--{k} {n}" for k, n in split.items())
            raise KernError(f"{checkpoint}: ships its own manifest.json; {flags} splits generated deployments "
                            "(give a split deployment's rank0.json with --manifest)")
        refuse_faster_build(f"{checkpoint}: ships its own manifest.json", batch_invariant,
                            "generate one without the folder's manifest.json")
        refuse_step_tokens(f"{checkpoint}: ships its own manifest.json", step_tokens,
                           "generate one without the folder's manifest.json")
        return checkpoint / "manifest.json"
    cfg_path = checkpoint / "config.json"
    if not cfg_path.exists():
        raise KernError(f"{checkpoint}: neither manifest.json nor config.json; give a deployment or checkpoint folder")
    config = read_object(cfg_path)
    options = {"context": context, "tp": tp, "ep": ep, "batch_invariant": batch_invariant}
    if step_tokens is not None:  # only when given: the default's cache keys stay those of before
        options["tokens"] = step_tokens
    for entry in _entry_points("kern.generators"):
        gen = entry.load()
        if gen.accepts(config):
            key = hashlib.sha256(json.dumps([config, target, entry.value, _source_digest(entry.module), options],
                                            sort_keys=True).encode()).hexdigest()[:16]
            root = cache_dir() / "deployments"
            final = root / f"{checkpoint.name}-{target}-{key}"
            name = "rank0.json" if split else "manifest.json"
            if (final / name).is_file():
                return final / name
            model = config.get("_name_or_path") or checkpoint.name
            try:
                return _build(gen, config, root, final, target, model if isinstance(model, str) else checkpoint.name,
                              options)
            except (ValueError, RuntimeError, OSError) as exc:  # the generator says why it cannot build
                raise KernError(f"{cfg_path}: generator {entry.name!r} cannot build a {target} deployment: {exc}") from None
    archs = config.get("architectures")
    raise KernError(f"{cfg_path}: no installed generator builds architectures {archs}")
