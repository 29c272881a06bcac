"""kern run: stream generated text, then prefill and decode tok/s."""

from __future__ import annotations

import sys

from .manifest.problems import ManifestError
from .runtime.errors import KernError


def _auto_target() -> str:
    """cuda when the driver sees a GPU (with cuda-bindings installed), else cpu. The model
    package ships its pinned kernels, so no CUDA toolkit is needed."""
    try:
        from .runtime.devices.cuda.driver import open_device

        open_device(0)
    except Exception:  # noqa: BLE001 - any failure of the probe means: run on the cpu
        return "cpu"
    return "cuda"


def main(args) -> int:
    from .api import load

    try:
        model = load(args.model, manifest=args.manifest, target=args.target or _auto_target(),
                     run_ahead=args.run_ahead)
        dev = model.engine.device.kind
        print(f"[kern] {model.verified.manifest.model} on {dev}", file=sys.stderr)
        gen = model.generate(args.prompt, chat=args.chat, max_tokens=args.max_tokens,
                             temperature=args.temperature, seed=args.seed,
                             on_text=lambda s: print(s, end="", flush=True))
    except (KernError, ManifestError) as exc:
        print(f"kern run: {exc}", file=sys.stderr)
        return 1
    print()
    print(f"[kern] prefill {gen.prompt_tokens} tokens: {gen.prefill_tok_s:.1f} tok/s | "
          f"decode {len(gen.tokens)} tokens: {gen.decode_tok_s:.1f} tok/s | finish: {gen.finish_reason}",
          file=sys.stderr)
    return 0
