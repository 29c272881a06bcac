"""The one-kernel decode against the per-op graph path and transformers eager, side by side in
one run on the GPU.

    python bench/mega.py [--shapes smollm2-135m,llama-3.2-1b] [--batch 1,16] [--new 128] [--prompt 32]

Random-weight checkpoints (seeded) of the real shapes. For each shape and batch: greedy `new`
tokens after a `prompt`-token prompt. The megakernel runs each whole generation (prompt
included) as one launch: `mega_gen_tok_s` counts new tokens over that launch's wall time;
`mega_decode_tok_s` is decode alone, (T(new + 1) - T(1)) / new a step (the prompt's steps
cancel). The per-op path (bench/decode.py's run_kern: prefill program, then decode graphs eight
steps a host wait) and, at batch 1, transformers eager decode the same prompts. Then the steady state at
position `--deep` (batch 1): ms a token and achieved weight bandwidth against the measured read
ceiling (a bf16 sum over 4 GiB). Prints one JSON line a run, then all of it."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from decode import run_hf, run_kern  # (bench/decode.py, beside this script: the per-op path and transformers)


def read_ceiling_tb_s() -> float:
    """Device read bandwidth: the best of 5 bf16 sums over 4 GiB (each element read once)."""
    import torch

    x = torch.ones(2 << 30, dtype=torch.bfloat16, device="cuda")
    best = float("inf")
    for _ in range(6):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        x.sum(dtype=torch.float32)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    n = x.numel() * 2
    del x
    torch.cuda.empty_cache()
    return n / best / 1e12


def checkpoint(name: str) -> Path:
    """The seeded random checkpoint of shape `name`, made once in $MEGA_CKPTS (shared by the
    steps of bench/mega_gpu.py) or in a fresh temporary folder."""
    from kern_models.common.random_checkpoint import make

    root = Path(os.environ.get("MEGA_CKPTS") or tempfile.mkdtemp())
    folder = root / name
    if not (folder / "config.json").is_file():
        make(name, folder, device="cuda", max_positions=4096)
    return folder


def timed(fn, repeats: int = 2) -> tuple[float, object]:
    """(median wall seconds of `repeats` calls after one warm-up, the last result)."""
    out = fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2], out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="smollm2-135m,llama-3.2-1b")
    ap.add_argument("--batch", default="1,16")
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--deep", type=int, default=512, help="position of the steady-state figure (0: skip)")
    ap.add_argument("--no-hf", action="store_true", help="skip transformers eager")
    args = ap.parse_args()

    import torch
    import transformers

    from kern.api import Model
    from kern.mega import MegaModel
    from kern_models.llama.generator import generate

    ceiling = read_ceiling_tb_s()
    results = {"gpu": torch.cuda.get_device_name(0), "read_ceiling_tb_s": round(ceiling, 2), "runs": []}
    print(json.dumps({"gpu": results["gpu"], "read_ceiling_tb_s": results["read_ceiling_tb_s"]}), flush=True)
    batches = [int(b) for b in args.batch.split(",")]
    for name in args.shapes.split(","):
        tmp = Path(tempfile.mkdtemp())
        ckpt = checkpoint(name)
        cfg = json.loads((ckpt / "config.json").read_text())
        mega = MegaModel(generate(cfg, tmp / "mega", target="mega", model=name, context=1024), ckpt,
                         sequences=max(batches))
        per_op = Model(generate(cfg, tmp / "cuda", target="cuda", model=name, context=4096), ckpt,
                       state_budget=4 << 30)
        ref = None if args.no_hf else transformers.AutoModelForCausalLM.from_pretrained(
            ckpt, dtype=torch.bfloat16, attn_implementation="eager").cuda().eval()
        weight_bytes = sum(int(np.prod(mega.engine.shapes[n])) * 2 for n, b in mega.engine.m.buffers.items()
                           if b.kind == "weight" and n != "embed")
        rng = np.random.default_rng(0)
        for batch in batches:
            prompts = rng.integers(0, cfg["vocab_size"], (batch, args.prompt)).astype(np.int32)
            plist = prompts.tolist()
            t_gen, toks = timed(lambda: mega.generate_batch(plist, args.new))
            t_one, _ = timed(lambda: mega.generate_batch(plist, 1))
            t_more, _ = timed(lambda: mega.generate_batch(plist, args.new + 1))
            step_s = (t_more - t_one) / args.new
            k = run_kern(per_op, prompts, args.new, 8)
            row = {
                "shape": name, "batch": batch, "prompt": args.prompt, "new": args.new,
                "mega_gen_ms": round(t_gen * 1e3, 2), "mega_gen_tok_s": round(batch * args.new / t_gen, 1),
                "mega_decode_tok_s": round(batch / step_s, 1), "mega_step_us": round(step_s * 1e6, 1),
                "mega_launches_per_generation": mega.launches_per_generation,
                "mega_weight_tb_s": round(weight_bytes / step_s / 1e12, 2),
                "per_op_decode_tok_s": round(k["tok_s"], 1), "per_op_step_us": round(k["step_ms"] * 1e3, 1),
                "per_op_launches_per_step": len(per_op.engine.launches[per_op.protocol.for_rows(batch, 1).program]),
                "ratio_mega_over_per_op": round(batch / step_s / k["tok_s"], 2),
                "greedy_first16_agreement_mega_vs_per_op": float(np.mean(
                    np.array([t[:16] for t in toks]) == np.array([t[:16] for t in k["tokens"]]))),
            }
            if ref is not None and batch == 1:  # the peer at batch 1 only: the call's time is short
                h = run_hf(ref, prompts, args.new)
                row.update(hf_eager_decode_tok_s=round(h["tok_s"], 1),
                           greedy_first16_agreement_mega_vs_hf=float(np.mean(
                               np.array([t[:16] for t in toks]) == np.array(h["tokens"])[:, :16])))
            results["runs"].append(row)
            print(json.dumps(row), flush=True)
        if args.deep:
            deep = rng.integers(0, cfg["vocab_size"], args.deep).tolist()
            t_one, _ = timed(lambda: mega.generate(deep, 1))
            t_more, _ = timed(lambda: mega.generate(deep, args.new + 1))
            step_s = (t_more - t_one) / args.new
            row = {"shape": name, "batch": 1, "position": args.deep, "mega_ms_per_token": round(step_s * 1e3, 4),
                   "mega_weight_tb_s": round(weight_bytes / step_s / 1e12, 2),
                   "fraction_of_read_ceiling": round(weight_bytes / step_s / 1e12 / ceiling, 3),
                   "weight_bytes_per_token": weight_bytes}
            results["runs"].append(row)
            print(json.dumps(row), flush=True)
        del mega, per_op, ref
        torch.cuda.empty_cache()
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
