"""The vLLM plugin: `register` is the `vllm.general_plugins` entry point (run in every vLLM
process); it registers KernForCausalLM, imported lazily so that vLLM's model inspection and
its front-end process never load kern's runtime or touch the GPU."""

from __future__ import annotations

ARCHITECTURE = "KernForCausalLM"


def register() -> None:
    from vllm import ModelRegistry

    if ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCHITECTURE, "kern.hosts.vllm.model:KernForCausalLM")
