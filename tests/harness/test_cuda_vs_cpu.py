"""An sm_90a manifest judged span by span against its cpu reference (needs an H200)."""

from __future__ import annotations

import json

import pytest

from kern.harness.judge import Options, judge

pytestmark = pytest.mark.gpu


# On the H200 with the real embedded weights (2026-11-30) the verdict is INCONCLUSIVE: 31 f32-vs-bf16
# spans beyond their floor, one argmax flip at a 0.025 near-tie, KL 0.0023. Making the harness
# decide across dtypes (floors in the candidate's dtype, a workload that grows) is open work.
@pytest.mark.xfail(reason="kern test across devices does not decide yet (f32 reference, bf16 candidate)",
                   strict=False)
def test_sm90a_manifest_passes_against_its_cpu_reference(smollm2, smol_a, tmp_path):
    from kern_models.llama.config import ConfigError
    from kern_models.llama.generator import generate

    try:
        from kern.runtime.devices.cuda.driver import open_device

        open_device(0)
    except Exception as exc:  # no driver, no GPU, no bindings
        pytest.skip(f"no CUDA device: {exc}")
    try:
        b = generate(json.loads((smollm2 / "config.json").read_text()), tmp_path / "b", target="cuda",
                     model="SmolLM2-135M-Instruct").parent
    except ConfigError as exc:
        pytest.skip(f"the llama generator cannot build sm_90a yet: {exc}")
    r = judge(smol_a, b, smollm2, Options(seed=0, seqs=3, decode_steps=2, max_prompt=48))
    print("\n".join(r.lines + [r.verdict.line]))
    assert r.verdict.status == "PASS", r.verdict.line
