"""Across two GPUs of one host, in one device call (issue 41): tensor parallel, expert parallel
and pipeline stages, each beside one GPU in the same run.

    python3 bench/multi_gpu.py --device        on an nvidia-h200-x2 machine: install the carried
                                               wheels, then every step below in its own process
                                               under its own timeout; logs, JSON lines and
                                               summary.json in $OUT
    python3 bench/multi_gpu.py --step pp       one step in this process (the environment ready)

Steps (`--steps`, in order):
  tests  the multi-GPU tests: tests/tp, tests/cut and tests/qwen3_moe/test_cuda.py, `-m gpu`
         (TP=2 against one GPU, batch invariance and reproducibility of both all-reduces, EP=2
         logits, pipeline stages bit for bit)
  tp     bench/tp.py on the Llama-3.1-8B shape at batch 1: TP=2 against TP=1 decode tok/s (run-ahead
         1 and 8), teacher-forced parity, where a step goes
  ep     the Qwen3-30B-A3B shape at --moe-layers layers (random, sharpened): EP=2 against EP=1,
         greedy tokens (equal, bit for bit, is the claim) and decode tok/s at --moe-batch
  pp     the Llama-3.1-8B shape (random): kern cut's 2 stages on GPU 0 and GPU 1 (`--pp 2`) against
         one GPU: greedy tokens of --streams streams (equal is the claim) and decode tok/s of
         all of them stepping together (bench/decode.py's run_kern, one host wait a step and
         run-ahead 8, at each --micro micro-batches a step), then
         the host loop's output tok/s over the same streams (Model.generate_batch: prefill,
         scheduling and decode, as kern serve steps them)
Random weights: the throughput figures are real, the tokens mean only "the same or not".
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from shared import ROOT  # bench/shared.py, beside this script

STEPS = ("tests", "tp", "ep", "pp")


def emit(rows: list, **row) -> None:
    rows.append(row)
    print(json.dumps(row), flush=True)


def device_run(args) -> int:
    from shared import Run, install

    out = Path(os.environ.get("OUT", "/tmp/out"))
    out.mkdir(parents=True, exist_ok=True)
    r = Run(out, install(Path("/tmp/site")))
    budget = {"tests": args.tests_timeout, "tp": args.tp_timeout, "ep": args.ep_timeout, "pp": args.pp_timeout}
    summary: dict = {"steps": {}}
    for step in args.steps.split(","):
        if step == "tests":
            cmd = [sys.executable, "-m", "pytest", "tests/tp", "tests/cut", "tests/qwen3_moe/test_cuda.py", "-m", "gpu",
                   "-q", "-p", "no:cacheprovider"]
        elif step == "tp":
            cmd = [sys.executable, str(ROOT / "bench" / "tp.py"), "--shapes", "llama-3.1-8b", "--tp", "2", "--batch", "1",
                   "--out", str(out / "tp.json")]
        else:
            cmd = [sys.executable, __file__, "--step", step, "--new", str(args.new), "--moe-layers",
                   str(args.moe_layers), "--moe-batch", args.moe_batch, "--moe-shape", args.moe_shape, "--pp-shape", args.pp_shape,
                   "--streams", str(args.streams), "--memory", str(args.memory), "--micro", args.micro]
        text = r.step(step, cmd, budget[step])
        lines = [ln for ln in text.splitlines() if ln.startswith("{")]
        tail = [ln for ln in text.splitlines() if ln.strip()][-1:] or ["(no output)"]
        summary["steps"][step] = {"rows": [json.loads(ln) for ln in lines], "last_line": tail[0][:500]}
        print(f"{step}: {tail[0][:300]}", flush=True)
        (out / "summary.json").write_text(json.dumps({**summary, "notes": r.summary}, indent=1) + "\n")
    return 0


def ep_step(args) -> list[dict]:
    from decode import run_kern
    from kern.api import Model
    from kern_models.qwen3_moe.generator import generate
    from kern_models.qwen3_moe.random_checkpoint import model_of
    from kern_models.common.random_checkpoint import word_tokenizer

    rows: list[dict] = []
    tmp = Path(tempfile.mkdtemp())
    t0 = time.perf_counter()
    ref = model_of(args.moe_shape, device="cuda" if args.target == "cuda" else "cpu", layers=args.moe_layers)
    ref.save_pretrained(tmp / "ckpt")
    word_tokenizer(ref.config.vocab_size).save(str(tmp / "ckpt" / "tokenizer.json"))
    del ref
    cfg = json.loads((tmp / "ckpt" / "config.json").read_text())
    emit(rows, step="ep", checkpoint_s=round(time.perf_counter() - t0, 1), layers=args.moe_layers)
    models = {ep: Model(generate(cfg, tmp / f"ep{ep}", target=args.target, model="qwen3-moe-random", context=1024,
                                 ep=ep),
                        tmp / "ckpt", state_budget=8 << 30) for ep in (1, 2)}
    rng = np.random.default_rng(0)
    for batch in [int(b) for b in args.moe_batch.split(",")]:
        prompts = rng.integers(0, cfg["vocab_size"], (batch, 32)).astype(np.int32)
        r = {ep: run_kern(m, prompts, args.new, 1) for ep, m in models.items()}
        emit(rows, step="ep", batch=batch, ep1_tok_s=round(r[1]["tok_s"], 1), ep2_tok_s=round(r[2]["tok_s"], 1),
             speedup=round(r[2]["tok_s"] / r[1]["tok_s"], 3), same_tokens=r[1]["tokens"] == r[2]["tokens"])
    return rows


def pp_step(args) -> list[dict]:
    from decode import run_kern
    from kern.api import Model
    from kern.generation import SamplingParams
    from kern_models.common.random_checkpoint import model_of, save
    from kern_models.llama.generator import generate

    rows: list[dict] = []
    tmp = Path(tempfile.mkdtemp())
    t0 = time.perf_counter()
    ref = model_of(args.pp_shape, device="cuda" if args.target == "cuda" else "cpu")
    save(ref, tmp / "ckpt")
    del ref
    cfg = json.loads((tmp / "ckpt" / "config.json").read_text())
    man = generate(cfg, tmp / "dep", target=args.target, model=args.pp_shape, context=1024)
    emit(rows, step="pp", checkpoint_s=round(time.perf_counter() - t0, 1), shape=args.pp_shape)
    models = {}
    for pp in (1, 2):
        t0 = time.perf_counter()
        models[pp] = Model(man, tmp / "ckpt", state_budget=args.memory << 30, max_seqs=args.streams,
                           **({"pp": pp} if pp > 1 else {}))
        emit(rows, step="pp", pp=pp, load_s=round(time.perf_counter() - t0, 1),
             devices=[getattr(getattr(e.device, "dev", None), "ordinal", "cpu")
                      for e in getattr(models[pp].engine, "stages", [models[pp].engine])])
    rng = np.random.default_rng(0)
    prompts = rng.integers(0, cfg["vocab_size"], (args.streams, 32)).astype(np.int32)
    for ahead in (1, 8):  # a host wait a step; the loop's run-ahead (the steps' micro-batches in one flow)
        one = run_kern(models[1], prompts, args.new, ahead)
        for micro in [int(x) for x in args.micro.split(",")]:
            models[2].engine.micro_batches = micro
            two = run_kern(models[2], prompts, args.new, ahead)
            emit(rows, step="pp", streams=args.streams, what="decode steps (run_kern)", run_ahead=ahead,
                 micro_batches=micro, one_gpu_tok_s=round(one["tok_s"], 1), pp2_tok_s=round(two["tok_s"], 1),
                 speedup=round(two["tok_s"] / one["tok_s"], 3), one_gpu_step_ms=round(one["step_ms"], 2),
                 pp2_step_ms=round(two["step_ms"], 2), same_tokens=one["tokens"] == two["tokens"])
    models[2].engine.micro_batches = int(args.micro.split(",")[0])
    params = SamplingParams(max_tokens=args.new)
    loop = {}
    for pp, m in models.items():
        m.generate_batch([p.tolist() for p in prompts[:4]], SamplingParams(max_tokens=4))  # warm
        t0 = time.perf_counter()
        gens = m.generate_batch([p.tolist() for p in prompts], params)
        dt = time.perf_counter() - t0
        loop[pp] = (sum(len(g.tokens) for g in gens) / dt, [g.tokens for g in gens])
    emit(rows, step="pp", streams=args.streams, what="host loop (generate_batch)",
         one_gpu_out_tok_s=round(loop[1][0], 1), pp2_out_tok_s=round(loop[2][0], 1),
         speedup=round(loop[2][0] / loop[1][0], 3), same_tokens=loop[1][1] == loop[2][1])
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", action="store_true", help="the whole device call (install, every step)")
    ap.add_argument("--step", choices=("ep", "pp"), help="one step, in this process")
    ap.add_argument("--steps", default=",".join(STEPS))
    ap.add_argument("--new", type=int, default=64, help="tokens decoded a stream")
    ap.add_argument("--moe-shape", default="qwen3-30b-a3b")
    ap.add_argument("--moe-layers", type=int, default=4, help="decoder layers of the shape's (Qwen3-30B-A3B: 48)")
    ap.add_argument("--moe-batch", default="1,16,64")
    ap.add_argument("--pp-shape", default="llama-3.1-8b")
    ap.add_argument("--streams", type=int, default=128)
    ap.add_argument("--micro", default="2,4", help="micro-batches a step (pp), each measured")
    ap.add_argument("--memory", type=int, default=16, help="GiB of state memory a device (pp)")
    ap.add_argument("--target", default="cuda", help="a dry run's: cpu (small --pp-shape, few --streams)")
    ap.add_argument("--tests-timeout", type=int, default=100)
    ap.add_argument("--tp-timeout", type=int, default=170)
    ap.add_argument("--ep-timeout", type=int, default=100)
    ap.add_argument("--pp-timeout", type=int, default=200)
    args = ap.parse_args()
    if args.device:
        return device_run(args)
    if args.step == "ep":
        ep_step(args)
    elif args.step == "pp":
        pp_step(args)
    else:
        ap.error("give --device or --step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
