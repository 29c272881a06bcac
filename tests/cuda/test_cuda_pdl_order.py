"""The launch order that programmatic dependent launch (PDL) relies on, checked on the CPU in
the generator's sm_90a manifests (models/common/cuda/common.cuh says why it must hold).

Two kernels let the next one launch at entry instead of after their wait: attention_decode and
gemv_residual. A kernel launched behind one of them may start while the kernels before it
still run, so before its own wait it must read only what cannot be changing: the gemv family
reads only its weights there. attention_decode reads K/V rows of earlier positions before its
wait, so the kernel before it must trigger after its wait (its launch then means everything
before that kernel is complete)."""

from __future__ import annotations

import pytest

from kern_models.llama.kernels.cuda.table import KERNELS, Pdl

EARLY = {k.entry for k in KERNELS if k.pdl is Pdl.EARLY}  # griddepcontrol.launch_dependents at entry
WEIGHTS_ONLY_BEFORE_WAIT = {k.entry for k in KERNELS if k.before_wait == "weights"}

CONFIGS = {
    "llama": dict(architectures=["LlamaForCausalLM"], hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=64, intermediate_size=128, vocab_size=256,
                  tie_word_embeddings=True),
    "qwen3": dict(architectures=["Qwen3ForCausalLM"], hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=128, intermediate_size=128, vocab_size=256,
                  tie_word_embeddings=True),
}


def _launches(cfg: dict) -> dict[str, list[tuple[str, bool]]]:
    """{program: [(entry, launched with the PDL attribute), ...]} in launch order."""
    from kern_models.llama.manifests import cuda as manifest_cuda
    from kern_models.llama.config import shape_of

    m = manifest_cuda.build(shape_of(cfg), "tiny")
    out = {}
    for name, prog in m["programs"].items():
        seq = []
        for call in prog["calls"]:
            impl = m["ops"][call["op"]]["impl"]
            seq += [(la["entry"], bool(la.get("pdl"))) for la in impl.get("launches", [])] or [("extern", False)]
        out[name] = seq
    return out


def _violations(seq: list[tuple[str, bool]]) -> list[str]:
    bad = []
    for (before, _), (entry, pdl) in zip(seq, seq[1:]):
        if pdl and before in EARLY and entry not in WEIGHTS_ONLY_BEFORE_WAIT:
            bad.append(f"{entry} launches behind {before}'s early trigger")
        if pdl and entry == "attention_decode" and before in EARLY:
            bad.append(f"attention_decode reads K/V before its wait behind {before}'s early trigger")
    return bad


def test_the_table_names_the_early_triggers():
    assert EARLY == {"attention_decode", "gemv_residual"}


@pytest.mark.parametrize("arch", sorted(CONFIGS))
def test_kernels_behind_an_early_trigger_read_only_weights_before_their_wait(arch):
    programs = _launches(CONFIGS[arch])
    assert any(e in EARLY and pdl for seq in programs.values() for e, pdl in seq), "no early trigger is launched"
    assert {name: _violations(seq) for name, seq in programs.items()} == {name: [] for name in programs}


def test_the_check_catches_attention_behind_an_early_trigger():
    """The rule broken on purpose: attention_decode and rms_norm (not a weights-only kernel)
    behind gemv_residual; a launch without the PDL attribute waits for everything before it
    and is never flagged."""
    seq = [("norm_gemv_rope_append", True), ("gemv_residual", True), ("attention_decode", True),
           ("gemv_residual", False), ("rms_norm", True)]
    assert _violations(seq) == ["attention_decode launches behind gemv_residual's early trigger",
                                "attention_decode reads K/V before its wait behind gemv_residual's early trigger",
                                "rms_norm launches behind gemv_residual's early trigger"]
