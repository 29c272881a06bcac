"""--no-batch-invariance (kern run, kern serve; load(batch_invariant=False)): the generated GPU
deployment whose many-row programs run through cuBLASLt, cached apart from the default
batch-invariant one; where a family's only build is batch-invariant (every cpu build, the
megakernel) the flag is refused in one line naming the family, never ignored; a folder that ships
its own manifest.json, or a manifest given with it, is refused in one line that names it and the flag."""

from __future__ import annotations

import json

import pytest

from kern import deployments
from kern.cli import parser
from kern.errors import KernError


@pytest.fixture()
def tiny(tmp_path):
    """A checkpoint folder the sm_90a kernels take (head_dim 64): its config.json is all a
    deployment is generated from."""
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
              "intermediate_size": 512, "max_position_embeddings": 512, "rope_theta": 10000.0,
              "rms_norm_eps": 1e-5, "vocab_size": 256, "tie_word_embeddings": False}
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps(config))
    return tmp_path / "ckpt"


def _cublaslt(manifest) -> bool:
    return "cublaslt" in manifest.read_text()


@pytest.mark.parametrize("target,invariant,cublaslt", [
    ("sm_90a", True, False),  # the default: every row in the gemv's order
    ("sm_90a", False, True),  # the faster build: prefill and the wide decode through cuBLASLt
    ("cpu", True, False),
])
def test_the_option_picks_the_deployment(tiny, target, invariant, cublaslt):
    got = deployments.deployment_for(tiny, target, batch_invariant=invariant)
    assert _cublaslt(got) == cublaslt
    assert (got == deployments.deployment_for(tiny, target)) == invariant, \
        "the faster build is cached apart from the default one"


def test_the_flag_is_refused_where_the_only_build_is_invariant(tiny):
    """The cpu build has no faster variant: asking for one is one line naming the family and the
    flag (it used to change nothing, silently)."""
    with pytest.raises(KernError) as err:
        deployments.deployment_for(tiny, "cpu", batch_invariant=False)
    line = str(err.value)
    assert "\n" not in line and "generator 'llama' cannot build a cpu deployment: --no-batch-invariance: llama " \
        "has one cpu build, batch-invariant" in line, line


def test_a_folder_with_its_own_manifest_is_refused_in_one_line(tiny):
    generated = deployments.deployment_for(tiny, "sm_90a")
    (tiny / "manifest.json").write_bytes(generated.read_bytes())
    with pytest.raises(KernError) as err:
        deployments.deployment_for(tiny, "sm_90a", batch_invariant=False)
    line = str(err.value)
    assert "\n" not in line and str(tiny) in line and "--no-batch-invariance" in line


def test_a_given_manifest_with_the_flag_is_refused_in_one_line(tiny):
    from kern.api import load

    manifest = deployments.deployment_for(tiny, "sm_90a")
    with pytest.raises(KernError) as err:  # refused before anything loads: no GPU needed
        load(tiny, manifest=manifest, target="sm_90a", batch_invariant=False)
    line = str(err.value)
    assert "\n" not in line and str(manifest) in line and "--no-batch-invariance" in line


@pytest.mark.parametrize("command", ["run", "serve"])
@pytest.mark.parametrize("argv,want", [([], True), (["--no-batch-invariance"], False)])
def test_the_commands_take_the_flag(command, argv, want):
    assert parser().parse_args([command, *argv]).batch_invariant is want
