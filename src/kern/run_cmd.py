"""kern run: stream generated text, then prefill and decode tok/s."""

from __future__ import annotations

import sys
from pathlib import Path

from .manifest.problems import ManifestError
from .runtime.devices.cuda.errors import CudaUnavailable  # imports no CUDA
from .runtime.errors import KernError


def _auto_target() -> tuple[str, str | None]:
    """cuda when the driver sees a GPU, else cpu (the model package ships its pinned kernels: no
    CUDA toolkit is needed). The second value says why not cuda when an NVIDIA device is
    present, so that a fallback is never silent."""
    present = Path("/dev/nvidiactl").exists()
    try:
        from .runtime.devices.cuda.driver import open_device

        open_device(0)
    except Exception as exc:  # noqa: BLE001 - any failure of the probe means: run on the cpu
        return "cpu", (f"an NVIDIA device is present but unusable: {exc}" if present else None)
    return "cuda", None


def pick_target(target: str | None, doing: str) -> str:
    """The --target given, else the auto target; a fall back to the cpu says why on stderr."""
    if target is None:
        target, why_not_cuda = _auto_target()
        if why_not_cuda:
            print(f"[kern] {doing} on the cpu: {why_not_cuda}", file=sys.stderr)
    return target


def main(args) -> int:
    from .api import load
    from .mega import TARGET as MEGA_TARGET

    if args.mega and args.target == "cpu":
        print("kern run: --mega decodes with a CUDA kernel (sm_90a); it does not run with --target cpu",
              file=sys.stderr)
        return 1
    try:
        target = MEGA_TARGET if args.mega else pick_target(args.target, "running")
        model = load(args.model, manifest=args.manifest, target=target, context=args.context,
                     max_seqs=args.max_seqs, memory=args.memory, run_ahead=args.run_ahead, tp=args.tp, ep=args.ep)
        dev = model.engine.device.kind + (f" x {args.tp} (tensor parallel)" if args.tp > 1 else "") + \
            (f" x {args.ep} (expert parallel)" if args.ep > 1 else "")
        print(f"[kern] {model.verified.manifest.model} on {dev}{' (decode: one kernel a step)' if args.mega else ''}",
              file=sys.stderr)
        gen = model.generate(args.prompt, chat=args.chat, max_tokens=args.max_tokens,
                             temperature=args.temperature, seed=args.seed,
                             on_text=lambda s: print(s, end="", flush=True))
    except (KernError, ManifestError, CudaUnavailable) as exc:
        print(f"kern run: {exc}", file=sys.stderr)
        return 1
    print()
    print(f"[kern] prefill {gen.prompt_tokens} tokens: {gen.prefill_tok_s:.1f} tok/s | "
          f"decode {len(gen.tokens)} tokens: {gen.decode_tok_s:.1f} tok/s | finish: {gen.finish_reason}",
          file=sys.stderr)
    return 0
