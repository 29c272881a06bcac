"""kern bench: the command. Everything a run needs is checked before anything is measured
(the workload, the output paths, matplotlib for a chart); each problem is one line, exit 1."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..manifest.problems import ManifestError
from ..say import manifest_line
from ..runtime.errors import KernError
from . import report
from .workload import read


def _writable(flag: str, path: str) -> None:
    parent = Path(path).resolve().parent
    if not parent.is_dir():
        raise KernError(f"{flag} {path}: folder {parent} does not exist")
    if Path(path).is_dir():
        raise KernError(f"{flag} {path}: is a folder; give a file name")


def _check_chart(path: str) -> None:
    _writable("--chart", path)
    if Path(path).suffix.lower() not in (".png", ".svg"):
        raise KernError(f"--chart {path}: give a .png or .svg file name")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise KernError("--chart needs matplotlib, which kern does not install: pip install matplotlib "
                        "(the JSON and the table need nothing more)") from None


def main(args) -> int:
    from .run import bench, bench_compare, manifest_file

    to_stdout = args.json == "-"
    try:
        wl = read(args.workload)
        for flag, p in (("MANIFEST", args.manifest), ("--compare", args.compare)):
            if p is not None and not manifest_file(p).is_file():
                raise KernError(f"{flag} {p}: no manifest.json there")
        if args.json and not to_stdout:
            _writable("--json", args.json)
        if args.chart:
            _check_chart(args.chart)
        weights = args.weights
        if weights is None:
            from ..registry import default_model

            weights = default_model(progress=not to_stdout)
        elif not Path(weights).is_dir():
            raise KernError(f"--weights {weights}: not a folder (give a Hugging Face checkpoint folder)")
        kw = {"isolate": args.isolate, "samples": args.samples, "memory": args.memory, "progress": not to_stdout}
        doc = (bench_compare(args.manifest, args.compare, weights, wl, **kw) if args.compare
               else bench(args.manifest, weights, wl, **kw))
    except ManifestError as exc:
        print(f"kern bench: {manifest_line(exc)}", file=sys.stderr)
        return 1
    except KernError as exc:
        print(f"kern bench: {exc}", file=sys.stderr)
        return 1
    text = json.dumps(doc, indent=1)
    if to_stdout:
        print(text)
    else:
        print("\n".join(report.table(doc)))
        if args.json:
            try:
                Path(args.json).write_text(text + "\n")
            except OSError as exc:
                print(f"kern bench: --json {args.json}: cannot write ({exc.strerror or exc})", file=sys.stderr)
                return 1
    if args.chart:
        try:
            report.chart(doc, args.chart)
        except KernError as exc:
            print(f"kern bench: {exc}", file=sys.stderr)
            return 1
    if not doc["scenarios"]:
        print(f"kern bench: every shape of {args.workload} was dropped; nothing was measured", file=sys.stderr)
        return 1
    bad = [sc for sc in doc["scenarios"] if sc.get("isolate") and not sc["isolate"]["gate"]["ok"]]
    if bad:
        print(f"kern bench: isolate gate failed ({bad[0]['program']} {bad[0]['groups']} x {bad[0]['rows']} @ "
              f"{bad[0]['context']}): {bad[0]['isolate']['gate']['what']}; the isolated times are not trustworthy",
              file=sys.stderr)
        return 1
    return 0
