"""Every flag means the same for every family: an option a family cannot honour (a split it has
no build for, --no-batch-invariance where its only build is batch-invariant) is refused in one
line naming the family and the flag, never dropped silently (issue 37, item 4). The generators
are called as the engine calls them (kern.deployments passes the flags as options)."""

from __future__ import annotations

import pytest

from kern_models.common.errors import ConfigError
from kern_models.kimi_linear.random_checkpoint import shape_config
from kern_models.qwen3_moe.random_checkpoint import SHAPES as MOE_SHAPES
from tests.conftest import TINY_CONFIG

LLAMA = {**TINY_CONFIG, "head_dim": 64, "hidden_size": 256, "intermediate_size": 512}
MOE = {"architectures": ["Qwen3MoeForCausalLM"], **MOE_SHAPES["small"], "max_position_embeddings": 512}
KIMI = {"architectures": ["KimiLinearForCausalLM"], **shape_config("tiny"), "max_position_embeddings": 512}


def _generator(family: str):
    from importlib import import_module

    return import_module(f"kern_models.{family}.generator").GENERATOR


@pytest.mark.parametrize("family,config,target,options,flag", [
    ("llama", LLAMA, "cpu", {"batch_invariant": False}, "--no-batch-invariance"),
    ("llama", LLAMA, "mega", {"batch_invariant": False}, "--no-batch-invariance"),
    ("llama", LLAMA, "cpu", {"ep": 2}, "--ep 2"),
    ("qwen3_moe", MOE, "cpu", {"batch_invariant": False}, "--no-batch-invariance"),
    ("qwen3_moe", MOE, "cpu", {"tp": 2}, "--tp 2"),
    ("qwen3_moe", MOE, "cuda", {"tp": 2}, "--tp 2"),
    ("kimi_linear", KIMI, "cpu", {"batch_invariant": False}, "--no-batch-invariance"),
    ("kimi_linear", KIMI, "cpu", {"tp": 2}, "--tp 2"),
    ("kimi_linear", KIMI, "cuda", {"ep": 2}, "--ep 2"),
])
def test_an_option_the_family_cannot_honour_is_one_line_naming_it(tmp_path, family, config, target, options, flag):
    with pytest.raises(ConfigError) as err:
        _generator(family).generate(config, tmp_path, target=target, **options)
    line = str(err.value)
    assert "\n" not in line and line.startswith(f"{flag}: {family} "), line


@pytest.mark.parametrize("family,config", [("llama", LLAMA), ("qwen3_moe", MOE), ("kimi_linear", KIMI)])
def test_the_faster_build_is_honoured_where_a_family_has_one(tmp_path, family, config):
    """On cuda each family takes --no-batch-invariance: each builds its faster programs beside
    the invariant default."""
    path = _generator(family).generate(config, tmp_path, target="cuda", batch_invariant=False)
    assert path.is_file()


def test_a_value_that_is_not_a_bool_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="batch_invariant .no.: must be true or false"):
        _generator("llama").generate(LLAMA, tmp_path, target="cuda", batch_invariant="no")
