"""vLLM's view of a kern deployment's paged state: one attention-like layer whose KV cache spec
makes vLLM allocate pages of exactly the manifest's host layout, and a metadata builder that
passes vLLM's common metadata through untouched (its tensors are vLLM's persistent buffers, so
the forward's copies of them are valid in vLLM's replayed CUDA graphs).

vLLM sizes a page as 2 * block_size * num_kv_heads * head_size * dtype bytes; the spec gives
numbers whose product is the manifest's page, so vLLM's budget, block pool and block tables
count kern's pages. The backend's cache shape is [pages, *page axes]: what kern.hosts.layout
checks before anything launches."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from vllm.config import VllmConfig, get_current_vllm_config
from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
from vllm.v1.attention.backend import (AttentionBackend, AttentionCGSupport, AttentionImplBase,
                                       AttentionMetadataBuilder, CommonAttentionMetadata)
from vllm.v1.kv_cache_interface import FullAttentionSpec

from ..batch import HostError
from ..layout import PageLayout

TORCH_DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
KERN_DTYPES = {v: k for k, v in TORCH_DTYPES.items()}


def spec_numbers(layout: PageLayout) -> tuple[int, int]:
    """(num_kv_heads, head_size) for vLLM's spec: their product is half a token's elements."""
    per_token = layout.token_elems
    if per_token % 2:
        raise HostError(f"state {layout.state!r}: a token is {per_token} elements of {layout.dtype}; vLLM's attention "
                        "spec counts pages in pairs of K and V, so it must be even")
    last = layout.axes[-1][1]
    head = last if layout.axes[-1][0] != "token" and (per_token // 2) % last == 0 else 1
    return per_token // 2 // head, head


@dataclass
class KernMetadata:
    """vLLM's common metadata for this step, as vLLM built it."""

    common: CommonAttentionMetadata


class KernMetadataBuilder(AttentionMetadataBuilder[KernMetadata]):
    # full graphs of uniform decode batches only: a mixed batch's programs are chosen on the host
    _cudagraph_support = AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE
    reorder_batch_threshold = None

    def __init__(self, kv_cache_spec, layer_names: list[str], vllm_config: VllmConfig, device: torch.device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False, **model_specific) -> KernMetadata:
        return KernMetadata(common_attn_metadata)


class KernImpl(AttentionImplBase):
    """Never runs: the manifest's programs do the attention. vLLM asks backends for one."""

    def __init__(self, *args, **kwargs) -> None:
        raise HostError("kern's attention runs inside the manifest's programs; vLLM built an attention layer on the "
                        "kern backend")


def backend_for(layout: PageLayout) -> type[AttentionBackend]:
    """An attention backend class whose KV cache shape is the deployment's page layout."""
    page, tokens = layout.page_shape, layout.page_tokens

    class KernBackend(AttentionBackend):
        supported_dtypes = [torch.bfloat16, torch.float16, torch.float32]
        forward_includes_kv_cache_update = True

        @staticmethod
        def get_name() -> str:
            return "CUSTOM"

        @staticmethod
        def get_impl_cls():
            return KernImpl

        @staticmethod
        def get_builder_cls():
            return KernMetadataBuilder

        @staticmethod
        def get_supported_kernel_block_sizes():
            return [tokens]

        @staticmethod
        def get_kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_size: int,
                               cache_dtype_str: str = "auto") -> tuple[int, ...]:
            if block_size != tokens:
                raise HostError(f"vLLM asks for blocks of {block_size} tokens; the deployment's pages hold {tokens}")
            return (num_blocks, *page)

    return KernBackend


class KernStateLayer(nn.Module, AttentionLayerBase):
    """The deployment's paged state as a layer of vLLM's static forward context: vLLM allocates
    its KV cache from the spec below and binds the tensor to `kv_cache`."""

    def __init__(self, layout: PageLayout, index: int):
        super().__init__()
        self.layout = layout
        self.layer_name = f"kern_states.{index}"  # vLLM wants exactly one integer in a cache layer's name
        self.backend = backend_for(layout)
        self.kv_cache = torch.tensor([])
        config = get_current_vllm_config().compilation_config
        if self.layer_name in config.static_forward_context:
            raise HostError(f"vLLM already has a layer named {self.layer_name!r}")
        config.static_forward_context[self.layer_name] = self

    def get_attn_backend(self) -> type[AttentionBackend]:
        return self.backend

    def get_kv_cache_spec(self, vllm_config: VllmConfig) -> FullAttentionSpec:
        heads, head = spec_numbers(self.layout)
        return FullAttentionSpec(block_size=self.layout.page_tokens, num_kv_heads=heads, head_size=head,
                                 dtype=TORCH_DTYPES[self.layout.dtype])
