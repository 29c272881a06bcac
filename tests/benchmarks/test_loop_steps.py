"""bench/loop_steps.py on the CPU: the host loop's plans for a closed-loop workload, a small one.
Every request's tokens are stepped (the plans' decode rows and the prompts' first tokens add up
to requests x output), a prompt the step's budget cannot take whole rides beside the others'
decode rows (mixed steps), decode runs ahead where nobody waits, and bad sizes are refused in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH / "loop_steps.py"), *args], capture_output=True, text=True,
                          timeout=600)


def test_a_closed_loop_s_plans_add_up(tmp_path):
    # four prompts of 100 pass the cpu deployment's 256-row step: the last rides beside the first ones' decode rows
    p = run("--concurrency", "4", "--requests", "7", "--prompt", "100", "--shared", "16", "--output", "12",
            "--run-ahead", "4", "--work", str(tmp_path))
    assert p.returncode == 0, p.stderr[-2000:]
    s = json.loads(next(ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")).removeprefix("RESULT "))
    kinds = s["by_kind"]
    decode_rows = sum(k["steps"] * k["decode_rows_a_step"] for k in kinds.values())
    assert round(decode_rows) == 7 * (12 - 1)  # every token but each prompt's first comes from a decode row
    assert {"mixed", "run ahead"} <= set(kinds) and s["runs_ahead"] >= 1
    assert s["steps"] >= s["ideal_steps"] == 21 and s["steps_to_first_token"]["max"] >= 1


def test_bad_sizes_are_refused_in_one_line(tmp_path):
    p = run("--prompt", "10", "--shared", "11", "--work", str(tmp_path))
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "--shared between 0 and --prompt" in p.stderr
