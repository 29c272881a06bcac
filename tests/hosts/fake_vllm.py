"""Just enough of vllm's module tree for kern.hosts.vllm to import on a machine without vLLM:
the names the plugin imports, as plain classes. Only the tests use it (vLLM itself is never
imported here); installed into sys.modules for the duration of a test."""

from __future__ import annotations

import sys
import types
from abc import ABC
from dataclasses import dataclass, field
from enum import Enum

import torch

CONTEXT = types.SimpleNamespace(attn_metadata=None)
CONFIG = types.SimpleNamespace(compilation_config=types.SimpleNamespace(static_forward_context={}))


class AttentionCGSupport(Enum):
    NEVER = 0
    UNIFORM_SINGLE_TOKEN_DECODE = 1
    UNIFORM_BATCH = 2
    ALWAYS = 3


class AttentionBackend(ABC):
    pass


class AttentionImplBase(ABC):
    pass


class AttentionMetadataBuilder:
    def __class_getitem__(cls, item):
        return cls

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        self.kv_cache_spec, self.layer_names, self.vllm_config, self.device = kv_cache_spec, layer_names, vllm_config, device


class AttentionLayerBase(ABC):
    pass


@dataclass(frozen=True)
class FullAttentionSpec:  # vLLM's page: 2 * block_size * num_kv_heads * head_size * dtype bytes
    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: torch.dtype
    extra: dict = field(default_factory=dict)

    @property
    def page_size_bytes(self) -> int:
        return 2 * self.block_size * self.num_kv_heads * self.head_size * torch.empty((), dtype=self.dtype).element_size()


def modules() -> dict[str, types.ModuleType]:
    def mod(name, **attrs):
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        return m

    return {
        "vllm": mod("vllm", ModelRegistry=None),
        "vllm.config": mod("vllm.config", VllmConfig=object, get_current_vllm_config=lambda: CONFIG),
        "vllm.forward_context": mod("vllm.forward_context", get_forward_context=lambda: CONTEXT),
        "vllm.model_executor": mod("vllm.model_executor"),
        "vllm.model_executor.layers": mod("vllm.model_executor.layers"),
        "vllm.model_executor.layers.attention_layer_base": mod(
            "vllm.model_executor.layers.attention_layer_base", AttentionLayerBase=AttentionLayerBase),
        "vllm.v1": mod("vllm.v1"),
        "vllm.v1.attention": mod("vllm.v1.attention"),
        "vllm.v1.attention.backend": mod(
            "vllm.v1.attention.backend", AttentionBackend=AttentionBackend, AttentionCGSupport=AttentionCGSupport,
            AttentionImplBase=AttentionImplBase, AttentionMetadataBuilder=AttentionMetadataBuilder,
            CommonAttentionMetadata=object),
        "vllm.v1.kv_cache_interface": mod("vllm.v1.kv_cache_interface", FullAttentionSpec=FullAttentionSpec),
    }


def install(monkeypatch) -> None:
    for name, m in modules().items():
        monkeypatch.setitem(sys.modules, name, m)
    for name in [n for n in sys.modules if n.startswith("kern.hosts.vllm.")]:
        monkeypatch.delitem(sys.modules, name)
