"""kern test on the GPU: the sm_90a manifest of a SmolLM2-shaped model (random seeded weights,
as the device has no network for the embedded model) judged span by span against the cpu
reference manifest of the same checkpoint."""

from __future__ import annotations

import json
import time

import pytest

pytestmark = pytest.mark.gpu


def test_sm90a_manifest_passes_against_its_cpu_reference(tmp_path):
    from kern.harness.judge import Options, judge
    from kern_models.llama.generator import generate
    from kern_models.llama.random_checkpoint import make

    ckpt = make("smollm2-135m", tmp_path / "ckpt", max_positions=2048)
    cfg = json.loads((ckpt / "config.json").read_text())
    a = generate(cfg, tmp_path / "a", target="cpu", model="smollm2-135m").parent
    b = generate(cfg, tmp_path / "b", target="cuda", model="smollm2-135m").parent
    t0 = time.perf_counter()
    r = judge(a, b, ckpt, Options(seed=0, seqs=3, decode_steps=2, max_prompt=48))
    print("\n".join(r.lines + [r.verdict.line]) + f"\nwall {time.perf_counter() - t0:.1f} s")
    assert r.verdict.status == "PASS", r.verdict.line
