"""kern bench: the command. Everything a run needs is checked before anything is measured
(the workload, the output paths, matplotlib for a chart); each problem is one line, exit 1."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .args import memory, positive

HELP = "price every call of a manifest on a workload of real shapes"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("manifest", metavar="MANIFEST", help="manifest.json or a folder holding one")
    p.add_argument("--workload", required=True, metavar="TOML", help="samples, seed and [[sweep]] shapes")
    p.add_argument("--weights", default=None, metavar="CHECKPOINT_DIR", help="default: the embedded model")
    p.add_argument("--isolate", action="store_true", help="also time each distinct call alone, cold and warm")
    p.add_argument("--compare", default=None, metavar="B", help="a second manifest, priced span by span")
    p.add_argument("--samples", type=positive, default=None,
                   help="timed samples of each shape (default: the workload's `samples`, else 5)")
    p.add_argument("--memory", dest="state_budget", type=memory, default=None,
                   help="state (KV cache) budget, e.g. 2G (default: what the workload's largest shape needs)")
    p.add_argument("--json", default=None, metavar="OUT", help="write the results as JSON ('-': stdout)")
    p.add_argument("--chart", default=None, metavar="OUT", help="where the step's time goes (.png or .svg; "
                   "needs matplotlib)")


def _writable(flag: str, path: str) -> None:
    from ..errors import KernError

    parent = Path(path).resolve().parent
    if not parent.is_dir():
        raise KernError(f"{flag} {path}: folder {parent} does not exist")
    if Path(path).is_dir():
        raise KernError(f"{flag} {path}: is a folder; give a file name")


def _check_chart(path: str) -> None:
    from ..errors import KernError

    _writable("--chart", path)
    if Path(path).suffix.lower() not in (".png", ".svg"):
        raise KernError(f"--chart {path}: give a .png or .svg file name")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise KernError("--chart needs matplotlib, which kern does not install: pip install matplotlib "
                        "(the JSON and the table need nothing more)") from None


def main(args) -> int:
    from ..bench import report
    from ..bench.run import bench, bench_compare, manifest_file
    from ..bench.load import read
    from ..errors import KernError
    from .say import failed

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
            from ..deployments import default_model

            weights = default_model(progress=not to_stdout)
        elif not Path(weights).is_dir():
            raise KernError(f"--weights {weights}: not a folder (give a Hugging Face checkpoint folder)")
        kw = {"isolate": args.isolate, "samples": args.samples, "state_budget": args.state_budget, "progress": not to_stdout}
        doc = (bench_compare(args.manifest, args.compare, weights, wl, **kw) if args.compare
               else bench(args.manifest, weights, wl, **kw))
    except KernError as exc:
        return failed("bench", exc)
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
    off = [sc for sc in doc["scenarios"] if not sc["step"]["check"]["ok"]]
    if off:  # the table says NOT within; the exit code says it too, so no script takes the numbers
        sc, ck = off[0], off[0]["step"]["check"]
        print(f"kern bench: for {len(off)} of {len(doc['scenarios'])} shapes the calls do not add up to the step "
              f"within {ck['within']:.0%} (first: {sc['program']} {sc['groups']} x {sc['rows']} at context "
              f"{sc['context']}: {ck['ratio']:.1%}); their per-call times are not trustworthy (a busy machine: "
              "run again with more --samples)", file=sys.stderr)
        return 1
    return 0
