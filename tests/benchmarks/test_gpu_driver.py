"""bench/gpu.py, the one device driver, on the CPU: presets are checked before anything is
installed or run, and its summary is one line per bench/decode.py result."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.benchmarks import scripts

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_an_unknown_preset_is_refused_in_one_line_naming_the_presets():
    done = subprocess.run([sys.executable, str(BENCH / "gpu.py"), "--preset", "tests,fast"],
                          capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stdout.strip() == ("--preset: unknown fast (presets: tests, decode, final, peers, step, split, "
                                   "reach, variants, fused, embedded, serve, toolset, verdict, crossover, speculative)")


def test_the_summary_has_one_line_per_result():
    summary = scripts.load("summary")  # a script, not a package
    lines = summary.lines

    log = [json.dumps({"gpu": "H200"}), "noise",
           json.dumps({"shape": "smollm2-135m", "prefill_tokens": 2040, "kern_prefill_ms": 5.3,
                       "hf_sdpa_forward_ms": 40.7}),
           json.dumps({"shape": "smollm2-135m", "batch": 16, "kern_decode_tok_s": 17258, "kern_step_ms": 0.927,
                       "hf_eager_decode_tok_s": 445})]
    assert lines(log, "final") == ["final prefill smollm2-135m 5.3 ms; sdpa 40.7",
                                   "final decode smollm2-135m 16 17258 tok/s 0.927 ms; eager 445"]
