"""kern verify: check manifests, every problem at once, each naming its place."""

from __future__ import annotations

import argparse
import json

HELP = "check manifests (every problem, each naming its place)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="+", metavar="PATH", help="manifest.json or a folder holding one")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def main(args: argparse.Namespace) -> int:
    """`PATH: ok, N programs, M calls, K launches`, or `PATH: manifest failed verification:` and
    one line per problem; exit 1 when any path fails. --json: a list, one object per path."""
    from ..manifest.verify import verify_path

    results = []
    for path in args.paths:
        r = verify_path(path, files=True)
        if r.verified is not None:
            v = r.verified
            res = {"path": path, "ok": True, "programs": len(v.manifest.programs), "calls": v.ncalls,
                   "launches": v.launches}
            lines = [f"{path}: ok, {res['programs']} programs, {v.ncalls} calls, {v.launches} launches"]
        else:
            res = {"path": path, "ok": False, "problems": [{"where": p.where, "what": p.what} for p in r.problems]}
            lines = [f"{path}: manifest failed verification:", *(f"  {p}" for p in r.problems)]
        results.append(res)
        if not args.json:
            print("\n".join(lines))
    if args.json:
        print(json.dumps(results, indent=2))
    return 0 if all(r["ok"] for r in results) else 1
