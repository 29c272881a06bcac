"""kern test: the command. Facts stream one per line; the verdict is the last line; the exit
code is 0 PASS, 1 FAIL, 2 INCONCLUSIVE (also when the reference itself cannot be judged)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..manifest.problems import ManifestError
from ..runtime.errors import KernError
from ..runtime.pipeline import PIPELINE_FILE
from .judge import HarnessError, Options, judge


def main(args) -> int:
    weights = args.weights
    if weights is None:
        from ..registry import default_model  # the embedded default checkpoint (found by entry point)

        weights = default_model(progress=not args.json)
    d = Options()
    given = lambda v, default: default if v is None else v  # noqa: E731 - an explicit 0 stays 0
    opts = Options(seed=args.seed, seqs=given(args.seqs, d.seqs), decode_steps=given(args.decode_steps, d.decode_steps),
                   max_prompt=args.max_prompt, limit=given(args.kl_limit, d.limit),
                   time_cap=given(args.time_cap, d.time_cap))
    say = (lambda s: None) if args.json else (lambda s: print(s, flush=True))
    try:
        if (Path(args.candidate) / PIPELINE_FILE).is_file():  # a kern cut folder: its stages in sequence
            from .pipeline import judge_pipeline

            report = judge_pipeline(args.reference, args.candidate, weights, opts, say)
        else:
            report = judge(args.reference, args.candidate, weights, opts, say)
    except (HarnessError, ManifestError, KernError) as exc:
        line = f"INCONCLUSIVE: {exc}"
        print(json.dumps({"verdict": "INCONCLUSIVE", "exit": 2, "line": line}) if args.json else line)
        return 2
    if args.json:
        print(json.dumps(report.to_json(), indent=1))
    else:
        print(report.verdict.line)
    sys.stdout.flush()
    return report.verdict.code
