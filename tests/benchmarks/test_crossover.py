"""bench/crossover.py's arguments: a gemv bound outside what the decode program can step is one
line naming the flag, before any checkpoint is made."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.benchmarks.scripts import BENCH


@pytest.mark.parametrize("seqs", ["0", "40"])
def test_a_gemv_bound_past_the_decode_program_is_one_line(seqs):
    done = subprocess.run([sys.executable, str(BENCH / "crossover.py"), "--seqs", seqs],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == \
        f"crossover.py: error: --seqs {seqs}: the gemv decode program steps 1 to 32 sequences"
