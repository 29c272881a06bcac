"""What kern refuses of a vLLM configuration at start-up, one line each (pure: reads the
config's attributes, so the CPU tests pass plain objects of the same shape)."""

from __future__ import annotations

from ..batch import HostError
from ..layout import PageLayout


def check_config(cfg, layout: PageLayout, max_positions: int | None) -> None:
    """`cfg` is a vllm.config.VllmConfig (or an object with its attributes)."""
    par = cfg.parallel_config
    for flag, n in (("--tensor-parallel-size", par.tensor_parallel_size),
                    ("--pipeline-parallel-size", par.pipeline_parallel_size),
                    ("--decode-context-parallel-size", getattr(par, "decode_context_parallel_size", 1))):
        if n != 1:
            raise HostError(f"vLLM {flag} {n}: kern's vLLM plugin runs a deployment on one GPU a process "
                            "(a split kern deployment inside vLLM is not supported)")
    if cfg.speculative_config is not None:
        raise HostError("vLLM --speculative-config: kern's vLLM plugin gives logits for each sequence's last row only; "
                        "speculative decoding inside vLLM is not supported (kern serve has its own rounds)")
    if getattr(cfg, "lora_config", None) is not None:
        raise HostError("vLLM --enable-lora: a kern deployment binds its weights as the manifest says; LoRA adapters "
                        "are not supported")
    mode = cfg.compilation_config.cudagraph_mode
    mixed = mode.mixed_mode() if mode is not None else None
    if mixed is not None and getattr(mixed, "name", str(mixed)) == "FULL":
        raise HostError(f"vLLM cudagraph_mode {getattr(mode, 'name', mode)}: full graphs of mixed batches would freeze "
                        "kern's choice of programs; use the default (FULL_AND_PIECEWISE) or FULL_DECODE_ONLY")
    cache = cfg.cache_config
    if cache.block_size is not None and cache.block_size != layout.page_tokens:
        raise HostError(f"vLLM --block-size {cache.block_size}; the deployment's pages hold {layout.page_tokens} tokens "
                        f"(pass --block-size {layout.page_tokens})")
    if cache.cache_dtype not in ("auto", _TORCH_NAME.get(layout.dtype)):
        raise HostError(f"vLLM --kv-cache-dtype {cache.cache_dtype}; the deployment's pages are {layout.dtype} "
                        "(leave --kv-cache-dtype at auto)")
    max_len = cfg.model_config.max_model_len
    if max_positions is not None and max_len > max_positions:
        raise HostError(f"vLLM --max-model-len {max_len}; the deployment serves {max_positions} positions a sequence "
                        f"(pass --max-model-len {max_positions}, or a deployment of a longer context)")


_TORCH_NAME = {"bf16": "bfloat16", "f16": "float16", "f32": "float32"}
