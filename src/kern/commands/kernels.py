"""kern kernels: a manifest's modules (entries, sha256, where each comes from) and, with
--rebuild, whether the generators' builds from source reproduce every pinned sha256, so a user
can trust the kernels they were given. The generator is found through the kern.generators
entry points (a generator's rebuild(source, target) -> bytes | None); the engine names none."""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

from ..errors import KernError

HELP = "list a manifest's modules; --rebuild checks their sha256 from source"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("manifest", metavar="MANIFEST", help="manifest.json or a folder holding one")
    p.add_argument("--rebuild", action="store_true", help="rebuild from source with the generator's build")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _where(source: str, sha256: str, base: Path) -> dict:
    """Where the module's bytes are and whether they hash to the pin."""
    from ..files.modules import cache_dir

    if source.startswith(("https://", "hf:")):
        blob = cache_dir() / "blobs" / sha256
        ok = blob.is_file() and hashlib.sha256(blob.read_bytes()).hexdigest() == sha256
        return {"kind": "url", "path": str(blob), "present": blob.is_file(), "matches": ok}
    path = base / source
    if not path.is_file():
        return {"kind": "file", "path": str(path), "present": False, "matches": False}
    data = path.read_bytes()
    return {"kind": "file", "path": str(path), "present": True, "bytes": len(data),
            "matches": hashlib.sha256(data).hexdigest() == sha256}


def listing(v) -> list[dict]:
    m = v.manifest
    out = []
    for name, mod in m.modules.items():
        entries: dict[str, list[str]] = {}
        for op_name, op in m.ops.items():
            for l in op.impl.launches:
                if l.module == name:
                    entries.setdefault(l.entry, [])
                    if op_name not in entries[l.entry]:
                        entries[l.entry].append(op_name)
        out.append({"module": name, "source": mod.source, "sha256": mod.sha256,
                    "where": _where(mod.source, mod.sha256, v.base_dir),
                    "entries": [{"entry": e, "ops": ops} for e, ops in entries.items()]})
    return out


def rebuild(rows: list[dict], target: str) -> None:
    """Each row gains `rebuilt`: the generator that rebuilt it, the sha256 it built, and
    whether that is the pinned one (or why it could not be rebuilt)."""
    from ..deployments import generators

    gens = [g for g in generators() if hasattr(g, "rebuild")]
    for r in rows:
        got = None
        for g in gens:
            try:
                data = g.rebuild(r["source"], target)
            except (ValueError, RuntimeError, OSError) as exc:  # the generator says why it cannot
                r["rebuilt"] = {"by": getattr(g, "name", "?"), "error": str(exc).splitlines()[0]}
                break
            if data is not None:
                sha = hashlib.sha256(data).hexdigest()
                got = {"by": getattr(g, "name", "?"), "sha256": sha, "reproduced": sha == r["sha256"]}
                r["rebuilt"] = got
                break
        else:
            r["rebuilt"] = {"by": None, "error": "no installed generator builds this module from source"}


def _line(r: dict) -> list[str]:
    w = r["where"]
    state = ("sha256 ok" if w["matches"] else "sha256 MISMATCH") if w["present"] else "not present"
    size = f", {w['bytes']:,} bytes" if "bytes" in w else ""
    out = [f"{r['module']}: {r['source']} ({w['kind']} {w['path']}{size}, {state}) sha256 {r['sha256']}"]
    for e in r["entries"]:
        out.append(f"  {e['entry']}  (ops: {', '.join(e['ops'])})")
    rb = r.get("rebuilt")
    if rb is not None:
        if "error" in rb:
            out.append(f"  rebuild: NOT REBUILT: {rb['error']}")
        else:
            out.append(f"  rebuild ({rb['by']}): " + ("reproduced" if rb["reproduced"] else
                                                      f"DIFFERS: built {rb['sha256']}"))
    return out


def main(args) -> int:
    from .say import failed
    from ..manifest.verify import load_verified

    try:
        v = load_verified(args.manifest)
    except KernError as exc:
        return failed("kernels", exc)
    rows = listing(v)
    t = v.manifest.target
    if args.rebuild:
        try:
            rebuild(rows, t.arch or t.device)
        except KernError as exc:
            return failed("kernels", exc)
    if args.json:
        print(json.dumps({"manifest": str(args.manifest), "target": t.arch or t.device, "modules": rows}, indent=1))
    else:
        for r in rows:
            print("\n".join(_line(r)))
    bad = [r for r in rows if not r["where"]["matches"]]
    if args.rebuild:
        bad += [r for r in rows if not r["rebuilt"].get("reproduced")]
        if not args.json:
            n = sum(bool(r["rebuilt"].get("reproduced")) for r in rows)
            print(f"rebuilt from source: {n} of {len(rows)} modules reproduce their pinned sha256")
    return 1 if bad else 0
