"""kern test: the command. Facts stream one per line; the verdict is the last line; the exit
code is 0 PASS, 1 FAIL, 2 INCONCLUSIVE (also when the reference itself cannot be judged)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .args import non_negative, non_negative_real, positive

HELP = "judge a candidate manifest against a reference, span by span"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--reference", required=True, metavar="A",
                   help="the manifest taken as right (manifest.json or a folder holding one)")
    p.add_argument("--candidate", required=True, metavar="B",
                   help="the manifest judged (a manifest, a folder, or kern cut's stages folder)")
    p.add_argument("--weights", default=None, metavar="CHECKPOINT_DIR",
                   help="the checkpoint both run (default: the embedded model)")
    p.add_argument("--seed", type=non_negative, default=0, help="workload seed, a whole number >= 0 (default 0)")
    p.add_argument("--json", action="store_true", help="the verdict as JSON on stdout")
    p.add_argument("--seqs", type=positive, default=None, help="sequences in the workload (default 6)")
    p.add_argument("--decode-steps", type=non_negative, default=None,
                   help="decode steps per sequence (default 10; 0 judges prefill only)")
    p.add_argument("--max-prompt", type=positive, default=None, help="cap on prompt lengths, a smaller workload (default: one prefill chunk plus two "
                        "pages)")
    p.add_argument("--kl-limit", type=non_negative_real, default=None,
                   help="KL(A||B) limit in nats (default 0.01; a larger measured floor raises it)")
    p.add_argument("--time-cap", type=non_negative_real, default=None,
                   help="seconds after which thin evidence stops growing the workload (default 60; 0: never grow)")


def main(args) -> int:
    from ..errors import KernError
    from ..judge import judge as judging
    from ..judge.judge import Options
    from ..cut.pipeline import PIPELINE_FILE

    weights = args.weights
    if weights is None:
        from ..deployments import default_model  # the embedded default checkpoint (found by entry point)

        weights = default_model(progress=not args.json)
    d = Options()
    given = lambda v, default: default if v is None else v  # noqa: E731 - an explicit 0 stays 0
    opts = Options(seed=args.seed, seqs=given(args.seqs, d.seqs), decode_steps=given(args.decode_steps, d.decode_steps),
                   max_prompt=args.max_prompt, limit=given(args.kl_limit, d.limit),
                   time_cap=given(args.time_cap, d.time_cap))
    say = (lambda s: None) if args.json else (lambda s: print(s, flush=True))
    try:
        if (Path(args.candidate) / PIPELINE_FILE).is_file():  # a kern cut folder: its stages in sequence
            from ..judge.pipeline import judge_pipeline

            report = judge_pipeline(args.reference, args.candidate, weights, opts, say)
        else:
            report = judging.judge(args.reference, args.candidate, weights, opts, say)
    except KernError as exc:
        line = f"INCONCLUSIVE: {exc}"
        print(json.dumps({"verdict": "INCONCLUSIVE", "exit": 2, "line": line}) if args.json else line)
        return 2
    if args.json:
        print(json.dumps(report.to_json(), indent=1))
    else:
        print(report.verdict.line)
    sys.stdout.flush()
    return report.verdict.code
