"""What kern's vLLM plugin refuses at start-up (kern.hosts.vllm.checks), each in one line naming
vLLM's flag and the deployment's value, on a fake of vllm.config.VllmConfig's attributes (vLLM
is not installed here; its defaults for `vllm serve` on an H200 are the fake's)."""

from __future__ import annotations

import enum
from types import SimpleNamespace as NS

import pytest

from kern.hosts.batch import HostError
from kern.hosts.layout import host_layouts
from kern.hosts.vllm.checks import check_config


class Mode(enum.Enum):  # vllm.config.CUDAGraphMode's names and its mixed_mode()
    NONE = 0
    PIECEWISE = 1
    FULL = 2
    FULL_DECODE_ONLY = 3
    FULL_AND_PIECEWISE = 4

    def mixed_mode(self):
        return {Mode.FULL_DECODE_ONLY: Mode.NONE, Mode.FULL_AND_PIECEWISE: Mode.PIECEWISE}.get(self, self)


def vllm_config(**over):
    cfg = NS(parallel_config=NS(tensor_parallel_size=1, pipeline_parallel_size=1, decode_context_parallel_size=1),
             speculative_config=None, lora_config=None,
             compilation_config=NS(cudagraph_mode=Mode.FULL_AND_PIECEWISE),
             cache_config=NS(block_size=16, cache_dtype="auto"),
             model_config=NS(max_model_len=4096))
    for path, value in over.items():
        obj, *rest = path.split("__")
        target = cfg
        for part in [obj, *rest][:-1]:
            target = getattr(target, part)
        setattr(target, [obj, *rest][-1], value)
    return cfg


@pytest.fixture
def layout(verified_1b):
    return host_layouts(verified_1b)["kv"]


def test_vllms_defaults_are_accepted(layout):
    check_config(vllm_config(), layout, 4096)
    check_config(vllm_config(cache_config__block_size=None), layout, 4096)  # vLLM picks the backend's
    check_config(vllm_config(compilation_config__cudagraph_mode=Mode.FULL_DECODE_ONLY), layout, 4096)
    check_config(vllm_config(compilation_config__cudagraph_mode=Mode.NONE), layout, 4096)  # --enforce-eager


@pytest.mark.parametrize("over, phrase", [
    ({"parallel_config__tensor_parallel_size": 2}, "--tensor-parallel-size 2"),
    ({"parallel_config__pipeline_parallel_size": 2}, "--pipeline-parallel-size 2"),
    ({"speculative_config": NS(method="ngram")}, "--speculative-config"),
    ({"lora_config": NS(max_loras=1)}, "--enable-lora"),
    ({"compilation_config__cudagraph_mode": Mode.FULL}, "cudagraph_mode FULL"),
    ({"cache_config__block_size": 32}, "--block-size 32; the deployment's pages hold 16 tokens (pass --block-size 16)"),
    ({"cache_config__cache_dtype": "fp8"}, "--kv-cache-dtype fp8"),
    ({"model_config__max_model_len": 131072}, "--max-model-len 131072; the deployment serves 4096"),
])
def test_what_kern_cannot_honour_is_refused_in_one_line(layout, over, phrase):
    with pytest.raises(HostError) as e:
        check_config(vllm_config(**over), layout, 4096)
    assert phrase in str(e.value) and "\n" not in str(e.value)
