"""kern run: stream generated text, then prefill and decode tok/s."""

from __future__ import annotations

import argparse
import sys

from ..generation.params import DEFAULT_MAX_TOKENS
from .args import loop_options, model_arguments, non_negative, non_negative_real, positive, utf8

HELP = "generate text with a model (default: the embedded model)"
DEFAULT_PROMPT = "What is the capital of France?"  # kern run without --prompt


def add_arguments(p: argparse.ArgumentParser) -> None:
    model_arguments(p)
    p.add_argument("--prompt", type=utf8, default=None,
                   help=f"the text to continue (default: {DEFAULT_PROMPT!r}, said on stderr when used)")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--max-tokens", type=positive, default=DEFAULT_MAX_TOKENS,
                   help=f"tokens to generate at most (default {DEFAULT_MAX_TOKENS}); the prompt and these must fit the "
                        "context")
    p.add_argument("--temperature", type=non_negative_real, default=0.0, help="0 (the default) is greedy")
    p.add_argument("--seed", type=non_negative, default=0, help="sampling seed, a whole number >= 0")
    p.add_argument("--target", choices=("cpu", "cuda"), default=None,
                   help="cpu or cuda (default: cuda when a GPU and the CUDA kernels are usable)")
    p.add_argument("--run-ahead", type=positive, default=None,
                   help="greedy decode steps a host wait (default: 8 on CUDA, one graph launch for all "
                        "of them; 1 on the CPU)")
    p.add_argument("--mega", action="store_true",
                   help="decode with the one-kernel deployment: a step is one persistent cooperative launch "
                        "(CUDA sm_90a; docs/megakernel.md)")
    loop_options(p)


def main(args) -> int:
    from ..api import load
    from ..errors import KernError
    from ..mega import TARGET as MEGA_TARGET
    from ..runtime.target import pick_target
    from .say import failed

    if args.mega and args.target == "cpu":
        print("kern run: --mega decodes with a CUDA kernel (sm_90a); it does not run with --target cpu",
              file=sys.stderr)
        return 1
    try:
        target = MEGA_TARGET if args.mega else pick_target(args.target, "running")
        model = load(args.model, manifest=args.manifest, weights=args.weights, target=target, context=args.context,
                     max_seqs=args.max_seqs, state_budget=args.state_budget, run_ahead=args.run_ahead, tp=args.tp,
                     ep=args.ep, pp=args.pp, batch_invariant=args.batch_invariant, speculate=args.speculate,
                     step_tokens=args.step_tokens)
        dev = model.engine.device.kind + (f" x {args.tp} (tensor parallel)" if args.tp > 1 else "") + \
            (f" x {args.ep} (expert parallel)" if args.ep > 1 else "") + \
            (f" x {args.pp} (pipeline stages)" if args.pp > 1 else "")
        print(f"[kern] {model.verified.manifest.model} on {dev}{' (decode: one kernel a step)' if args.mega else ''}",
              file=sys.stderr)
        prompt = args.prompt
        if prompt is None:
            prompt = DEFAULT_PROMPT
            print(f"[kern] no --prompt given: {prompt!r}", file=sys.stderr)
        gen = model.generate(prompt, chat=args.chat, max_tokens=args.max_tokens,
                             temperature=args.temperature, seed=args.seed,
                             on_text=lambda s: print(s, end="", flush=True))
    except KernError as exc:  # a manifest that fails verification: its first problem, one line
        return failed("run", exc)
    print()
    sp = gen.speculation
    spec = (f" | speculative ({args.speculate}): {sp.tokens_per_round:.2f} tokens a round, "
            f"{sp.acceptance:.0%} of {sp.proposed} proposed kept" if sp is not None else "")
    print(f"[kern] prefill {gen.prompt_tokens} tokens: {gen.prefill_tok_s:.1f} tok/s | "
          f"decode {len(gen.tokens)} tokens: {gen.decode_tok_s:.1f} tok/s{spec} | finish: {gen.finish_reason}",
          file=sys.stderr)
    return 0
