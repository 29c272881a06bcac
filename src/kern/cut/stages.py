"""kern cut's output: each stage a verified manifest folder (its modules copied beside it) and
pipeline.json, which says how the stages chain (kern.cut.pipeline runs them)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path, PurePosixPath

from ..errors import KernError


def manifest_file(path: str | Path) -> Path:
    p = Path(path)
    return p / "manifest.json" if p.is_dir() else p


def read_times(path: str | Path, sha256: str) -> dict[str, list[float]]:
    """program -> time of each call (us): the scenarios' p50, weighted, summed, from kern bench JSON."""
    from ..files.jsonfiles import read_object

    try:
        doc = read_object(Path(path))
    except KernError as exc:  # the flag is the place a user looks for
        raise KernError(f"--times {exc}") from None
    if doc.get("kern_bench") != 1 or not isinstance(doc.get("scenarios"), list):
        raise KernError(f"--times {path}: not kern bench output (kern_bench 1 with scenarios)")
    if doc.get("manifest", {}).get("sha256") != sha256:
        raise KernError(f"--times {path}: measured on another manifest (sha256 "
                        f"{str(doc.get('manifest', {}).get('sha256'))[:12]}..., this one {sha256[:12]}...)")
    times: dict[str, list[float]] = {}
    try:
        for sc in doc["scenarios"]:
            per = times.setdefault(sc["program"], [0.0] * sc["program_calls"])
            for c in sc["calls"]:  # a call cheaper than the clock's noise can read below zero
                per[c["call"]] += sc["weight"] * max(c["us"]["p50"], 0.0)
    except (KeyError, TypeError, IndexError) as exc:
        raise KernError(f"--times {path}: malformed scenario ({type(exc).__name__}: {exc})") from None
    return times


def _module_path(source: str, name: str) -> str | None:
    """Where a relative module source lands in a stage folder (None: a URL, left as it is)."""
    if "://" in source or source.startswith("hf:"):
        return None
    rel = PurePosixPath(source)
    return str(rel) if not rel.is_absolute() and ".." not in rel.parts else f"modules/{name}{rel.suffix}"


def write_stages(manifest: str | Path, stages: int, out: str | Path, times_path: str | None = None) -> list[str]:
    from .plan import pipeline_doc, plan, stage_manifest
    from ..manifest.verify import load_verified, verify_text
    from .pipeline import PIPELINE_FILE

    path = manifest_file(manifest)
    v = load_verified(path)
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    times = read_times(times_path, sha) if times_path else None
    p = plan(v, stages, times)
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise KernError(f"--out {out}: exists and is not empty; give a new folder")
    folders, lines = [], []
    for k in range(stages):
        doc = stage_manifest(v, p, k)
        folder = out / f"stage{k}"
        folder.mkdir(parents=True, exist_ok=True)
        for name, mod in doc["modules"].items():
            dst = _module_path(mod["source"], name)
            if dst is not None:
                (folder / dst).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(v.base_dir / mod["source"], folder / dst)
                mod["source"] = dst
        text = json.dumps(doc, indent=1) + "\n"
        r = verify_text(text, str(folder / "manifest.json"), folder)
        if r.verified is None:  # a cut that does not verify is a bug of kern cut: say so, write nothing more
            raise KernError(f"stage {k} does not verify (a kern cut bug): {r.problems[0]}")
        (folder / "manifest.json").write_text(text)
        folders.append(folder.name)
        nw = sum(1 for b in doc["buffers"].values() if b["kind"] == "weight")
        ncalls = sum(len(pr["calls"]) for pr in doc["programs"].values())
        carried = sorted({b for s in p.segments if s.stage == k for b in s.receives})
        unit = "us" if times else "weight bytes"
        lines.append(f"stage{k}: {ncalls} calls, {nw} weights, {p.cost[k]:,.0f} {unit}"
                     + (f"; receives {', '.join(carried)}" if carried else ""))
    (out / PIPELINE_FILE).write_text(json.dumps(pipeline_doc(p, sha, folders), indent=1) + "\n")
    return lines
