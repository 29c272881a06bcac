"""kern cut's flags (the cut itself: kern.cut, which plans the stages, writes them with
pipeline.json and runs them in sequence)."""

from __future__ import annotations

import argparse
import sys

from ..errors import KernError
from .args import positive

HELP = "slice a manifest into pipeline stages"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("manifest", metavar="MANIFEST", help="manifest.json or a folder holding one")
    p.add_argument("--stages", type=positive, required=True, metavar="N",
                   help="pipeline stages to cut the model into (required): each a verified manifest owning a "
                        "contiguous run of the weights")
    p.add_argument("--out", default=None, metavar="DIR", help="default: <manifest folder>.stages<N>")
    p.add_argument("--times", default=None, metavar="BENCH_JSON",
                   help="balance by kern bench times instead of weight bytes")


def main(args) -> int:
    from ..cut.pipeline import PIPELINE_FILE
    from ..cut.stages import manifest_file, write_stages
    from .say import failed

    out = args.out or f"{manifest_file(args.manifest).parent.name}.stages{args.stages}"
    try:
        lines = write_stages(args.manifest, args.stages, out, args.times)
    except KernError as exc:
        return failed("cut", exc)
    except OSError as exc:
        print(f"kern cut: {exc.filename or out}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    for line in lines:
        print(line)
    print(f"{out}: {args.stages} stages, {PIPELINE_FILE}")
    return 0
