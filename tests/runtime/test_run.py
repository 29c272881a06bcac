"""The main job: kern run on the embedded model, and sampling that a seed decides."""

from __future__ import annotations

import subprocess
import sys


def test_kern_run_streams_text_and_reports_speeds():
    r = subprocess.run([sys.executable, "-m", "kern.cli", "run", "--chat", "--prompt",
                        "What is the capital of France?", "--max-tokens", "12", "--target", "cpu"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout
    assert "HuggingFaceTB/SmolLM2-135M-Instruct on cpu" in r.stderr
    assert "prefill" in r.stderr and "decode" in r.stderr and "tok/s" in r.stderr


def test_sampling_is_decided_by_the_seed(smollm2_model):
    m = smollm2_model
    prompt = "Write one sentence about the sea."
    a = m.generate(prompt, chat=True, max_tokens=16, temperature=1.0, seed=1).tokens
    b = m.generate(prompt, chat=True, max_tokens=16, temperature=1.0, seed=1).tokens
    c = m.generate(prompt, chat=True, max_tokens=16, temperature=1.0, seed=2).tokens
    greedy = m.generate(prompt, chat=True, max_tokens=16, temperature=0.0, seed=3).tokens
    assert a == b
    assert a != c
    assert greedy == m.generate(prompt, chat=True, max_tokens=16, temperature=0.0, seed=4).tokens
