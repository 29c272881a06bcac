"""Across two GPUs of one host, in one device call (issue 41): tensor parallel, expert parallel
and pipeline stages, each beside one GPU in the same run.

    python3 bench/multi_gpu.py --device        on an nvidia-h200-x2 machine: install the carried
                                               wheels, then every step below in its own process
                                               under its own timeout; logs, JSON lines and
                                               summary.json in $OUT
    python3 bench/multi_gpu.py --step pp       one step in this process (the environment ready)
    python3 bench/multi_gpu.py --make-ckpt moe one of the steps' seeded random checkpoints, into
                                               --moe-ckpt (or llama: --pp-ckpt), made where --target says

Serving across the two GPUs (kern serve --tp 2 / --ep 2 beside vLLM 0.26, --pp 2 beside one GPU)
is bench/multi_gpu_serve.sh, which runs these steps too, on its checkpoints, in the device calls
its header lists.

Steps (`--steps`, in order):
  tests  the multi-GPU tests: tests/tp, tests/cut and tests/qwen3_moe/test_cuda.py, `-m gpu`
         (TP=2 against one GPU, batch invariance and reproducibility of both all-reduces, EP=2
         logits, pipeline stages bit for bit)
  tp     bench/tp.py on the Llama-3.1-8B shape at batch 1: TP=2 against TP=1 decode tok/s (run-ahead
         1 and 8), teacher-forced parity, where a step goes
  ep     the Qwen3-30B-A3B shape at --moe-layers layers (random, sharpened): EP=2 against EP=1,
         greedy tokens (equal, bit for bit, is the claim) and decode tok/s at --moe-batch
  ep_bench  the all-to-all's share of an EP=2 decode step, from kern bench: `kern bench` of the
         EP=1 deployment (decode steps of --bench-rows sequences at context --bench-context), then
         kern bench's attribution (each call timed inside the real step, by prefixes) of the same
         steps on both ranks of the EP=2 deployment at once (`kern bench` takes one device's
         manifest: the ranks run the same prefixes in the same order, so their collectives pair
         up as in a step); the all-to-all is the ops the split adds to the step (sm_90a: the
         combine's push over NVLink and the all-reduce's barrier and sum; cpu: ep_dispatch and
         ep_combine), their us and share a rank, beside EP=1's step
  pp     the Llama-3.1-8B shape (random): kern cut's 2 stages on GPU 0 and GPU 1 (`--pp 2`) against
         one GPU: greedy tokens of --streams streams (equal is the claim) and decode tok/s of
         all of them stepping together (bench/decode.py's run_kern, one host wait a step and
         run-ahead 8, at each --micro micro-batches a step), then
         the host loop's output tok/s over the same streams (Model.generate_batch: prefill,
         scheduling and decode, as kern serve steps them)
Random weights: the throughput figures are real, the tokens mean only "the same or not".
--moe-ckpt / --pp-ckpt: the ep, ep_bench and pp steps' checkpoints (made there if the folder has
no config.json, else used as they are), so that steps and serving share one of each.
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

STEPS = ("tests", "tp", "ep", "ep_bench", "pp")
IN_PROCESS = ("ep", "ep_bench", "pp")  # the steps this script runs itself (--step)


def emit(into: list, **row) -> None:
    into.append(row)
    print(json.dumps(row), flush=True)


def step_command(step: str, args, out: Path) -> list[str]:
    """The command line of one step of a --device run (its own process)."""
    if step == "tests":
        return [sys.executable, "-m", "pytest", "tests/tp", "tests/cut", "tests/qwen3_moe/test_cuda.py", "-m", "gpu",
                "-q", "-p", "no:cacheprovider"]
    if step == "tp":
        return [sys.executable, str(ROOT / "bench" / "tp.py"), "--shapes", "llama-3.1-8b", "--tp", "2", "--batch", "1",
                "--out", str(out / "tp.json")]
    if step not in IN_PROCESS:
        raise ValueError(f"unknown step {step!r} (steps: {', '.join(STEPS)})")
    cmd = [sys.executable, __file__, "--step", step, "--new", str(args.new), "--moe-layers", str(args.moe_layers),
           "--moe-batch", args.moe_batch, "--moe-shape", args.moe_shape, "--pp-shape", args.pp_shape,
           "--streams", str(args.streams), "--memory", str(args.memory), "--micro", args.micro,
           "--bench-rows", args.bench_rows, "--bench-context", str(args.bench_context),
           "--bench-samples", str(args.bench_samples), "--target", args.target]
    for flag, folder in (("--moe-ckpt", args.moe_ckpt), ("--pp-ckpt", args.pp_ckpt)):
        if folder:
            cmd += [flag, folder]
    return cmd


def timeout_of(step: str, args) -> int:
    return getattr(args, f"{step}_timeout")


def device_run(args) -> int:
    from shared import Run, install

    out = Path(os.environ.get("OUT", "/tmp/out"))
    out.mkdir(parents=True, exist_ok=True)
    # --no-install: the environment is ready (bench/device_env.sh sourced: kern installed from this
    # tree, the carried wheels in /tmp/site), as under bench/multi_gpu_serve.sh
    r = Run(out, {**os.environ, "PYTHONUNBUFFERED": "1"} if args.no_install else install(Path("/tmp/site")))
    summary: dict = {"steps": {}}
    for step in args.steps.split(","):
        text = r.step(step, step_command(step, args, out), timeout_of(step, args))
        lines = [ln for ln in text.splitlines() if ln.startswith("{")]
        tail = [ln for ln in text.splitlines() if ln.strip()][-1:] or ["(no output)"]
        summary["steps"][step] = {"rows": [json.loads(ln) for ln in lines], "last_line": tail[0][:500]}
        print(f"{step}: {tail[0][:300]}", flush=True)
        (out / "summary.json").write_text(json.dumps({**summary, "notes": r.summary}, indent=1) + "\n")
    return 0


# a llama small enough for a dry run on the cpu that still splits two ways (4 heads, 2 kv heads)
TINY_LLAMA = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  intermediate_size=128, vocab_size=256, tie_word_embeddings=False, rms_norm_eps=1e-5,
                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0})


def checkpoint(kind: str, args) -> Path:
    """The seeded random checkpoint of a step (kind moe: --moe-shape at --moe-layers layers,
    sharpened; llama: --pp-shape, its config saying 131,072 positions as the real Llama-3.1's),
    made where --target says and saved with its word tokenizer into --moe-ckpt / --pp-ckpt (a
    folder of a fresh temporary one when not given); a folder holding a config.json is used as
    it is."""
    folder = Path((args.moe_ckpt if kind == "moe" else args.pp_ckpt) or Path(tempfile.mkdtemp()) / "ckpt")
    if (folder / "config.json").is_file():
        return folder
    import torch

    device = "cuda" if args.target == "cuda" else "cpu"
    if kind == "moe":
        from kern_models.common.random_checkpoint import word_tokenizer
        from kern_models.qwen3_moe.random_checkpoint import model_of

        torch.set_default_dtype(torch.bfloat16)  # initialise in bf16 (bench/moe_gpu.py's ckpt): 31 GB at 24 layers, not 62
        try:
            model = model_of(args.moe_shape, device=device, layers=args.moe_layers)
        finally:
            torch.set_default_dtype(torch.float32)
        model.save_pretrained(folder)
        word_tokenizer(model.config.vocab_size).save(str(folder / "tokenizer.json"))
    elif args.pp_shape == "tiny":
        import transformers

        from kern_models.common.random_checkpoint import save

        torch.manual_seed(0)
        with torch.device(device):
            model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY_LLAMA, max_position_embeddings=4096))
            with torch.no_grad():  # random logits are near-ties everywhere: make the model decisive
                model.lm_head.weight.mul_(40.0)
        save(model.to(torch.bfloat16), folder)
    else:
        from kern_models.common.random_checkpoint import make

        make(args.pp_shape, folder, device=device, max_positions=131072)
    return folder


def all_to_all(ep1_ops: set[str], rank: dict) -> dict:
    """The all-to-all of one rank's kern bench scenario (attribution.measure's document): the ops
    the split adds to the step (those of the EP=2 step that the EP=1 step of the same shape does
    not run), their microseconds a step (the calls' p50 summed), their share of the calls' sum
    (kern bench's share) and of the untraced step's p50."""
    added = sorted({o["op"] for o in rank["ops"]} - ep1_ops)
    us = sum(o["us"] for o in rank["ops"] if o["op"] in added)
    calls = sum(o["us"] for o in rank["ops"]) or 1.0
    step = rank["step"]["untraced_us"]["p50"] or 1.0
    return {"ops": added, "us": round(us, 1), "share": round(us / calls, 4), "of_step": round(us / step, 4)}


def bench_workload(args) -> str:
    return (f"samples = {args.bench_samples}\n[[sweep]]\ngroups = [{args.bench_rows}]\nrows = [1]\n"
            f"context = [{args.bench_context}]\n")


def ep_bench_step(args) -> list[dict]:
    """kern bench of the EP=1 deployment, then its attribution on both ranks of the EP=2 one at
    once (the module docstring, ep_bench); a line per scenario, every document in
    $OUT/ep_bench.json."""
    from kern.bench import scenario
    from kern.bench.attribution import measure
    from kern.bench.run import bench
    from kern.bench.timers import timer_for
    from kern.bench.workload import parse
    from kern.drive.engine_io import EngineIO
    from kern.drive.script import feed
    from kern.manifest.protocol import derive
    from kern.runtime.engine import DEFAULT_STATE_BUDGET
    from kern.world.ranks import RankedEngine, rank_manifests
    from kern_models.qwen3_moe.generator import generate

    rows: list[dict] = []
    tmp = Path(tempfile.mkdtemp())
    ckpt = checkpoint("moe", args)
    cfg = json.loads((ckpt / "config.json").read_text())
    wl = parse(bench_workload(args), "ep_bench.toml")
    dep = {ep: generate(cfg, tmp / f"ep{ep}", target=args.target, model="qwen3-moe-random", context=1024, ep=ep)
           for ep in (1, 2)}
    t0 = time.perf_counter()
    one = bench(dep[1], ckpt, wl, progress=False)  # kern bench itself, as `kern bench MANIFEST --workload`
    emit(rows, step="ep_bench", ep=1, bench_s=round(time.perf_counter() - t0, 1), dropped=one["dropped"])
    ranks = rank_manifests(dep[2])
    budget = scenario.state_budget(ranks[0], derive(ranks[0]), wl.shapes) or DEFAULT_STATE_BUDGET
    eng = RankedEngine(ranks, ckpt, state_budget=budget)
    lim = EngineIO(eng.ranks[0]).limits()
    w = scenario.widths(eng.ranks[0])
    docs = {"ep1": one, "ep2": []}
    measured = {(sc["groups"], sc["rows"], sc["context"]): sc for sc in one["scenarios"]}
    for shape in wl.shapes:
        sc = scenario.plan(shape, eng.protocol, lim, wl.seed)
        ep1 = measured.get((shape.groups, shape.rows, shape.context))
        if isinstance(sc, str) or ep1 is None:
            emit(rows, step="ep_bench", groups=shape.groups, dropped=sc if isinstance(sc, str) else "dropped at EP=1")
            continue
        for step in sc.prefix:  # the context, through the prefill program on every rank
            st = eng.protocol.for_rows(len(step.chunks), None)
            eng.run(st.program, *feed(step, st, sc.seqs, w))
        vars_, ins = feed(sc.measured, sc.stepper, sc.seqs, w)
        eng.run(sc.program, vars_, ins)
        t0 = time.perf_counter()
        got = eng.workers.each(lambda r: measure(timer_for(eng.ranks[r]), eng.ranks[r], sc.program, vars_,
                                                 wl.samples, 0.0))
        docs["ep2"].append({"groups": shape.groups, "rows": shape.rows, "context": shape.context, "ranks": got})
        ep1_ops = {o["op"] for o in ep1["ops"]}
        a2a = [all_to_all(ep1_ops, g) for g in got]
        emit(rows, step="ep_bench", program=sc.program, groups=shape.groups, rows=shape.rows, context=shape.context,
             ep1_step_us=round(ep1["step"]["untraced_us"]["p50"], 1),
             ep2_step_us=[round(g["step"]["untraced_us"]["p50"], 1) for g in got],
             ep2_check_ok=[g["step"]["check"]["ok"] for g in got],
             all_to_all_ops=a2a[0]["ops"], all_to_all_us=[a["us"] for a in a2a],
             all_to_all_share=[a["share"] for a in a2a], all_to_all_of_step=[a["of_step"] for a in a2a],
             ep1_top=[[o["op"], round(o["us"], 1)] for o in ep1["ops"][:4]],
             ep2_rank0_top=[[o["op"], round(o["us"], 1)] for o in got[0]["ops"][:6]],
             measure_s=round(time.perf_counter() - t0, 1))
    out = Path(os.environ.get("OUT", tmp))
    out.mkdir(parents=True, exist_ok=True)
    (out / "ep_bench.json").write_text(json.dumps(docs) + "\n")
    return rows


def ep_step(args) -> list[dict]:
    from decode import run_kern
    from kern.api import Model
    from kern_models.qwen3_moe.generator import generate

    rows: list[dict] = []
    tmp = Path(tempfile.mkdtemp())
    t0 = time.perf_counter()
    ckpt = checkpoint("moe", args)
    cfg = json.loads((ckpt / "config.json").read_text())
    emit(rows, step="ep", checkpoint_s=round(time.perf_counter() - t0, 1), layers=cfg["num_hidden_layers"])
    models = {ep: Model(generate(cfg, tmp / f"ep{ep}", target=args.target, model="qwen3-moe-random", context=1024,
                                 ep=ep),
                        ckpt, state_budget=8 << 30) for ep in (1, 2)}
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
    from kern_models.llama.generator import generate

    rows: list[dict] = []
    tmp = Path(tempfile.mkdtemp())
    t0 = time.perf_counter()
    ckpt = checkpoint("llama", args)
    cfg = json.loads((ckpt / "config.json").read_text())
    man = generate(cfg, tmp / "dep", target=args.target, model=args.pp_shape, context=1024)
    emit(rows, step="pp", checkpoint_s=round(time.perf_counter() - t0, 1), shape=args.pp_shape)
    models = {}
    for pp in (1, 2):
        t0 = time.perf_counter()
        models[pp] = Model(man, ckpt, state_budget=args.memory << 30, max_seqs=args.streams,
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


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", action="store_true", help="the whole device call (install, every step)")
    ap.add_argument("--step", choices=IN_PROCESS, help="one step, in this process")
    ap.add_argument("--make-ckpt", choices=("moe", "llama"), help="only make that checkpoint (into --moe-ckpt / "
                    "--pp-ckpt) and exit")
    ap.add_argument("--steps", default=",".join(STEPS), help="--device: the steps, in order")
    ap.add_argument("--no-install", action="store_true", help="--device: run the steps in this environment "
                    "(bench/device_env.sh sourced) instead of installing the carried wheels into /tmp/site")
    ap.add_argument("--new", type=int, default=64, help="tokens decoded a stream")
    ap.add_argument("--moe-shape", default="qwen3-30b-a3b")
    ap.add_argument("--moe-layers", type=int, default=4, help="decoder layers of the shape's (Qwen3-30B-A3B: 48)")
    ap.add_argument("--moe-batch", default="1,16,64")
    ap.add_argument("--pp-shape", default="llama-3.1-8b")
    ap.add_argument("--streams", type=int, default=128)
    ap.add_argument("--micro", default="2,4", help="micro-batches a step (pp), each measured")
    ap.add_argument("--memory", type=int, default=16, help="GiB of state memory a device (pp)")
    ap.add_argument("--moe-ckpt", default=None, help="the ep steps' checkpoint folder (made there if it has no "
                    "config.json; default: a temporary one)")
    ap.add_argument("--pp-ckpt", default=None, help="the pp step's checkpoint folder (likewise)")
    ap.add_argument("--bench-rows", default="1,16,64", help="ep_bench: sequences a decode step, each a scenario")
    ap.add_argument("--bench-context", type=int, default=160, help="ep_bench: tokens each sequence holds")
    ap.add_argument("--bench-samples", type=int, default=3, help="ep_bench: kern bench's timed samples")
    ap.add_argument("--target", default="cuda", help="a dry run's: cpu (small --pp-shape, few --streams)")
    ap.add_argument("--tests-timeout", type=int, default=100)
    ap.add_argument("--tp-timeout", type=int, default=170)
    ap.add_argument("--ep-timeout", type=int, default=100)
    ap.add_argument("--ep-bench-timeout", type=int, default=200)
    ap.add_argument("--pp-timeout", type=int, default=200)
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    if args.make_ckpt:
        print(checkpoint(args.make_ckpt, args))
        return 0
    if args.device:
        unknown = [s for s in args.steps.split(",") if s not in STEPS]
        if unknown:
            ap.error(f"--steps: unknown {', '.join(unknown)} (steps: {', '.join(STEPS)})")
        return device_run(args)
    if args.step is None:
        ap.error("give --device, --step or --make-ckpt")
    {"ep": ep_step, "ep_bench": ep_bench_step, "pp": pp_step}[args.step](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
