"""Issue 39's logits check, on the device inside vLLM's environment (its wheels on PYTHONPATH, as
bench/vllm_kern_gpu.sh installs them): vLLM with kern's forward pass (the plugin) against vLLM
with its own model, teacher-forced on seeded random token prompts, each judged against
transformers fp32 by transformers' own bf16-vs-fp32 spread (the rule of every family's parity:
kern_models.common.random_checkpoint.judge), and the plugin against vLLM's own model by the same
yardstick, and by how far transformers' bf16 is from vLLM's own model (a second bf16
implementation of the same weights).

    python3 bench/vllm_logits.py --ckpt CKPT --manifest MANIFEST --out OUT.json

vLLM gives a generated token's top TOPK log-probabilities (`logprobs`), not its logits, so every
source is compared over the fp32 reference's top TOPK tokens of the position (renormalized there;
a token a vLLM source did not return gets the lowest log-probability it did return, an upper
bound; the verdict says how much of the reference's mass the set holds). Each vLLM
runs in a process of its own (its memory freed between them), with its defaults but a short
context, no tokenizer (token prompts) and the log-probabilities asked for."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

def prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(0, vocab, length)] for _ in range(n)]


def vllm_role(args) -> None:
    """One vLLM (the plugin's, or its own model) writing each prompt's per-position top TOPK as
    JSON. Teacher-forced through prefixes: position i is the one token generated after the
    prompt's first i + 1 tokens (the plugin computes a sequence's last row's logits only, so
    vLLM's prompt_logprobs are not kern's to give; vLLM's prefix cache shares the prefixes)."""
    from vllm import LLM, SamplingParams

    extra = {"hf_overrides": {"architectures": ["KernForCausalLM"]}} if args.role == "plugin" else {}
    llm = LLM(model=args.ckpt, max_model_len=args.context, max_logprobs=args.topk, skip_tokenizer_init=True,
              gpu_memory_utilization=0.4, enforce_eager=True, **extra)  # eager: a start-up without
    # torch.compile and graph capture (minutes of a device call); the logits are the same model's
    ps = prompts(args.prompts, args.length, args.vocab, args.seed)
    sp = SamplingParams(max_tokens=1, temperature=0, logprobs=args.topk, detokenize=False)
    outs = llm.generate([{"prompt_token_ids": p[:i + 1]} for p in ps for i in range(len(p) - 1)], sp)
    flat = [{str(t): lp.logprob for t, lp in o.outputs[0].logprobs[0].items()} for o in outs]
    n = args.length - 1
    Path(args.part).write_text(json.dumps([flat[k * n:(k + 1) * n] for k in range(len(ps))]))


def from_vllm(rows: list, top: np.ndarray) -> np.ndarray:
    """A vLLM source's log-probabilities over the reference's tokens `top` [positions, TOPK]."""
    flat = [pos for prompt in rows for pos in prompt]
    out = np.empty(top.shape, np.float64)
    for i, (pos, toks) in enumerate(zip(flat, top)):
        floor = min(pos.values())
        out[i] = [pos.get(str(int(t)), floor) for t in toks]
    return out


def judge_role(args) -> dict:
    """transformers bf16 and fp32 (random_checkpoint.reference_logits, as every family's parity
    takes them), then every comparison and its verdict."""
    import torch
    from transformers import AutoModelForCausalLM

    from kern.drive.parity import compare, log_softmax
    from kern_models.common.random_checkpoint import judge, reference_logits

    ps = prompts(args.prompts, args.length, args.vocab, args.seed)
    model = AutoModelForCausalLM.from_pretrained(args.ckpt, dtype=torch.bfloat16).to(args.device)
    logits = reference_logits(model, ps)
    del model
    # each prompt's positions but its last (the vLLM sources' positions: a token after each prefix)
    keep = np.concatenate([np.arange(k * args.length, (k + 1) * args.length - 1) for k in range(len(ps))])
    lps = {name: log_softmax(logits[name][keep]) for name in ("fp32", "bf16")}
    top = np.argsort(-lps["fp32"], axis=-1)[:, :args.topk]
    ref, bf16 = (np.take_along_axis(lps[name], top, axis=-1) for name in ("fp32", "bf16"))
    sources = {role: from_vllm(json.loads(Path(f"{args.out}.{role}.json").read_text()), top)
               for role in ("plugin", "own")}
    spread = compare(ref, bf16)
    result = {"positions": int(ref.shape[0]), "topk": args.topk, "ckpt": args.ckpt,
              "mass_in_topk": float(np.exp(ref).sum(-1).mean()),
              "transformers_bf16_vs_fp32": spread}
    for role, got in sources.items():
        c = compare(ref, got)
        result[f"vllm_{role}_vs_fp32"] = {**c, **judge(spread, c)}
    c = compare(sources["own"], sources["plugin"])
    result["vllm_plugin_vs_vllm_own"] = {**c, **judge(spread, c)}
    # Two bf16 implementations of one model differ from each other by about the sum of their
    # distances from fp32, more than one bf16-vs-fp32 spread admits on near-tie rows: so the
    # plugin against vLLM's own model is also judged by how far transformers' bf16 is from it.
    peer = compare(sources["own"], bf16)
    result["transformers_bf16_vs_vllm_own"] = peer
    result["vllm_plugin_vs_vllm_own_by_transformers_bf16"] = {**c, **judge(peer, c)}
    return result


def sharpened(ckpt: str, factor: float, folder: Path) -> str:
    """CKPT with its final norm's weight times `factor` (a power of two: exact in bf16), the rest
    linked: every logit times `factor`, so a random checkpoint's near-uniform next tokens become
    decisive and the comparison judges more than the head of each distribution (the unsharpened
    Llama-3.2-1B's top 1,024 held 6.6% of the mass)."""
    from safetensors.torch import load_file, save_file

    folder.mkdir(parents=True, exist_ok=True)
    for f in Path(ckpt).iterdir():
        dst = folder / f.name
        if dst.exists() or dst.is_symlink():
            continue
        if f.suffix == ".safetensors":
            tensors = load_file(str(f))
            if "model.norm.weight" in tensors:
                tensors["model.norm.weight"] = tensors["model.norm.weight"] * factor
            save_file(tensors, str(dst), metadata={"format": "pt"})
        else:
            dst.symlink_to(f.resolve())
    return str(folder)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--manifest", help="KERN_MANIFEST for the plugin (default: the one it generates)")
    ap.add_argument("--out", required=True, help="the verdict's JSON (each vLLM's part beside it)")
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--length", type=int, default=48)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--topk", type=int, default=1024)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--device", default="cuda", help="transformers' device")
    ap.add_argument("--sharpen", type=float, default=8.0,
                    help="the final norm's weight times this (a power of two; 1: the checkpoint as it is)")
    ap.add_argument("--role", choices=("plugin", "own"), help=argparse.SUPPRESS)
    ap.add_argument("--part", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role:
        vllm_role(args)
        return
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **({"KERN_MANIFEST": args.manifest} if args.manifest else {})}
    if args.sharpen != 1:  # the same shapes: the plugin's deployment serves the copy's weights as they are
        args.ckpt = sharpened(args.ckpt, args.sharpen, Path(f"{args.out}.ckpt"))
    for role in ("plugin", "own"):
        if Path(f"{args.out}.{role}.json").exists():  # a part an earlier, cut-off run wrote: kept
            continue
        cmd = [sys.executable, __file__, "--ckpt", args.ckpt, "--out", args.out, "--prompts", str(args.prompts),
               "--length", str(args.length), "--vocab", str(args.vocab), "--seed", str(args.seed),
               "--topk", str(args.topk), "--context", str(args.context), "--sharpen", "1",
               "--role", role, "--part", f"{args.out}.{role}.json"]
        r = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if r.returncode:
            sys.exit(f"vllm_logits: the {role} vLLM failed ({r.returncode}):\n{r.stderr[-3000:]}")
    result = judge_role(args)
    Path(args.out).write_text(json.dumps(result, indent=1))
    for k, v in result.items():
        print(k, v)


if __name__ == "__main__":
    main()
