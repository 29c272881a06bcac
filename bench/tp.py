"""Tensor parallelism on the GPUs of one host: TP=N beside TP=1 and transformers, same run.

    python3 bench/tp.py --device            on the device machine: install the carried wheels, run
                                            the tp GPU tests, then every shape below
                                            in its own process under a timeout; logs and JSON in $OUT
    python3 bench/tp.py --shapes llama-3.2-1b --tp 2     one process (the environment ready)

Per shape (random weights, seeded, generated on the GPU; kern_models.common.random_checkpoint):
teacher-forced logits of TP=1, TP=N, transformers eager bf16 and transformers fp32 (the spread
of transformers' own bf16 against fp32 is the bar), KL and argmax agreement; a prefill (NCCL
all-reduces) followed by teacher-forced decode, TP=N against TP=1; decode tok/s at each batch,
TP=1, TP=N and `before` (the split with the LM head whole on every rank, as before the
vocabulary-split head: the same tokens, by construction) in the
same run; each call's time inside a batch-1 step (bench/tp_profile.py's attribution) for TP=1
and every rank of TP=N; and the decode step's collective launches alone (a graph of every such
launch of a step, replayed on every rank at once) against their NVLink floor. One JSON object
a line."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


NVLINK_GB_S = 450.0  # H200 NVLink 4: 900 GB/s a GPU, both directions together


def device_run(args) -> int:
    from shared import Run, install, installed_env

    out = Path(os.environ.get("OUT", "/tmp/out"))
    out.mkdir(parents=True, exist_ok=True)
    env = install(Path("/tmp/site"))
    if args.commands_only:  # kern as a user installs it (entry points: the generators)
        env = installed_env(Path("/tmp/site"), Path("/tmp/kern-cache-tp"))
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip().replace("\n", " | ")
    print(f"gpus: {smi}", flush=True)

    step = Run(out, env).step

    if args.commands_only:
        text = step("tp_commands", [sys.executable, __file__, "--commands-only", "--tp", str(args.tp)], args.timeout)
        print("\n".join(ln[:3000] for ln in text.splitlines() if ln.startswith("{") or "rror" in ln), flush=True)
        return 0
    text = step("tp_gpu_tests", [sys.executable, "-m", "pytest", "tests/tp", "-m", "gpu", "-q", "-x",
                                 "-p", "no:cacheprovider"], args.test_timeout)
    print("tests:", ([ln for ln in text.splitlines() if ln.strip()][-1:] or ["(no output)"])[0], flush=True)
    if "passed" not in text or "failed" in text:
        print("\n".join(text.splitlines()[-60:]))
    for shape in args.shapes.split(","):
        text = step(f"tp_{shape}", [sys.executable, __file__, "--shapes", shape, "--tp", str(args.tp),
                                    "--batch", args.batch, "--out", str(out / f"tp_{shape}.json"),
                                    *(["--commands"] if shape == args.commands_shape else [])],
                    args.timeout_8b if "8b" in shape else args.timeout)
        for ln in text.splitlines():
            if ln.startswith("{") or "Error" in ln or "error" in ln:
                print(ln[:2000], flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", action="store_true", help="the whole device run (install, tests, every shape)")
    ap.add_argument("--shapes", default="llama-3.1-8b,llama-3.2-1b", help="the 8B first: the headline")
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--batch", default="1,16")
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--forced", type=int, default=64, help="teacher-forced positions compared")
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--timeout", type=int, default=130, help="seconds a shape (--device)")
    ap.add_argument("--timeout-8b", type=int, default=180, help="seconds for the 8B shape (--device)")
    ap.add_argument("--test-timeout", type=int, default=80)
    ap.add_argument("--commands-shape", default="", help="a shape kern run --tp also runs on (--device; the "
                    "generators' entry points need --commands-only's install)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--commands", action="store_true", help="also kern run --tp, in one process and one a rank")
    ap.add_argument("--commands-only", action="store_true",
                    help="only kern run --tp (one process, one a rank) on a small random checkpoint, kern installed")
    args = ap.parse_args()
    if args.device:
        return device_run(args)
    if args.commands_only:
        print(json.dumps(commands(tiny_checkpoint(Path(tempfile.mkdtemp()) / "ckpt"), "cuda", args.tp)), flush=True)
        return 0
    rows = []
    for shape in args.shapes.split(","):
        rows += run_shape(shape, args)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


def emit(rows: list, row: dict) -> None:
    rows.append(row)
    print(json.dumps(row), flush=True)


def run_shape(name: str, args) -> list[dict]:
    import torch

    from decode import run_kern
    from kern.api import Model
    from tp_profile import attribution, by_op, prepared, variant, whole_head
    from kern_models.llama.generator import generate
    from kern_models.common.random_checkpoint import model_of, save
    from kern.drive.parity import compare, teacher_forced

    rows: list[dict] = []
    gpu = torch.cuda.get_device_name(0)
    tmp = Path(tempfile.mkdtemp())
    t0 = time.perf_counter()
    ref = model_of(name, device="cuda").eval()
    save(ref, tmp / "ckpt")
    ref.config._attn_implementation = "eager"
    cfg = json.loads((tmp / "ckpt" / "config.json").read_text())
    made_s = time.perf_counter() - t0
    split = generate(cfg, tmp / f"tp{args.tp}", target="cuda", model=name, context=args.context, tp=args.tp)
    paths = {"tp1": generate(cfg, tmp / "tp1", target="cuda", model=name, context=args.context),
             f"tp{args.tp}": split, "before": variant(split.parent, args.tp, tmp / "before", whole_head)}
    models = {}
    for key, man in paths.items():
        t0 = time.perf_counter()
        models[key] = Model(man, tmp / "ckpt", state_budget=4 << 30)
        emit(rows, {"shape": name, "gpu": gpu, "model": key, "load_s": round(time.perf_counter() - t0, 1),
                    "checkpoint_made_s": round(made_s, 1)})
    one, many, before = models["tp1"], models[f"tp{args.tp}"], models["before"]
    rng = np.random.default_rng(0)
    vocab = cfg["vocab_size"]

    # teacher-forced parity: every position through the decode program (peer all-reduces)
    ids = [int(i) for i in rng.integers(0, vocab, args.forced)]
    with torch.no_grad():
        x = torch.tensor([ids], device="cuda")
        hf16 = ref(x).logits[0].float().cpu().numpy()
        ref.float()
        hf32 = ref(x).logits[0].float().cpu().numpy()
        ref.to(torch.bfloat16)
    k1, kn = teacher_forced(one, ids), teacher_forced(many, ids)
    emit(rows, {"shape": name, "parity": "teacher-forced decode", "positions": len(ids),
                f"tp{args.tp}_vs_tp1": compare(k1, kn), "tp1_vs_hf_fp32": compare(hf32, k1),
                f"tp{args.tp}_vs_hf_fp32": compare(hf32, kn), "hf_bf16_vs_hf_fp32": compare(hf32, hf16),
                f"tp{args.tp}_vs_hf_bf16": compare(hf16, kn), "tp1_vs_hf_bf16": compare(hf16, k1)})

    # prefill (NCCL all-reduces) then teacher-forced decode: TP=N against TP=1
    prompt = [int(i) for i in rng.integers(0, vocab, 300)]
    cont = [int(i) for i in rng.integers(0, vocab, 16)]
    p1, pn = prefilled(one, prompt, cont), prefilled(many, prompt, cont)
    emit(rows, {"shape": name, "parity": "prefill 300 (nccl) + 16 forced", f"tp{args.tp}_vs_tp1": compare(p1, pn)})
    del ref
    torch.cuda.empty_cache()

    # decode tok/s, TP=1 and TP=N in the same run
    for batch in [int(b) for b in args.batch.split(",")]:
        prompts = rng.integers(0, vocab, (batch, args.prompt)).astype(np.int32)
        for ahead in ((1, 8) if batch == 1 else (1,)):
            r1 = run_kern(one, prompts, args.new, ahead)
            rn = run_kern(many, prompts, args.new, ahead)
            r0 = run_kern(before, prompts, args.new, ahead)
            agree = float(np.mean(np.array(r1["tokens"])[:, :32] == np.array(rn["tokens"])[:, :32]))
            emit(rows, {"shape": name, "gpu": gpu, "batch": batch, "run_ahead": ahead,
                        "tp1_tok_s": round(r1["tok_s"], 1), f"tp{args.tp}_tok_s": round(rn["tok_s"], 1),
                        "speedup": round(rn["tok_s"] / r1["tok_s"], 3), "tp1_step_ms": round(r1["step_ms"], 3),
                        f"tp{args.tp}_step_ms": round(rn["step_ms"], 3),
                        "before_tok_s": round(r0["tok_s"], 1), "before_speedup": round(r0["tok_s"] / r1["tok_s"], 3),
                        "greedy_first32_agreement": agree,
                        "before_same_tokens": r0["tokens"] == rn["tokens"]})
    # where a batch-1 step goes: each call's time inside the real step (kern bench's prefixes),
    # TP=1 and every rank of TP=N at once
    for key, m in (("tp1", one), (f"tp{args.tp}", many)):
        program, vars_ = prepared(m, [int(i) for i in rng.integers(0, vocab, args.prompt)])
        for r, t in enumerate(attribution(m, program, vars_, 3)):
            emit(rows, {"shape": name, "gpu": gpu, "attribution": key, "rank": r, "step_us": round(t["step_us"], 1),
                        "calls_sum_us": round(t["sum_us"], 1), "by_op": by_op(t["calls"])})
    for batch in [int(b) for b in args.batch.split(",")]:
        emit(rows, {"shape": name, "gpu": gpu, "collectives": all_reduce_time(many, batch, cfg["hidden_size"])})
    if args.commands:
        del one, many, before, models
        emit(rows, {"shape": name, **commands(tmp / "ckpt", "cuda", args.tp)})
    return rows


def tiny_checkpoint(folder: Path) -> Path:
    """A small random llama checkpoint (4 layers, hidden 1024) with its word tokenizer."""
    import torch
    import transformers

    from kern_models.common.random_checkpoint import word_tokenizer

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=1024, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                                   head_dim=128, intermediate_size=2048, vocab_size=4096, max_position_embeddings=1024)
    transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(folder)
    word_tokenizer(cfg.vocab_size).save(str(folder / "tokenizer.json"))
    return folder


def commands(ckpt: Path, target: str, tp: int, port: int = 29533) -> dict:
    """kern run on the checkpoint: unsplit, split over `tp` ranks in one process, and one
    process a rank as torchrun starts them (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
    MASTER_PORT); whether each gives the unsplit text."""
    argv = [sys.executable, "-m", "kern.cli", "run", str(ckpt), "--target", target, "--max-tokens", "24",
            "--prompt", " ".join(f"w{i}" for i in range(1, 40, 3))]

    def run(extra: list[str], env: dict | None = None) -> subprocess.Popen:
        return subprocess.Popen(argv + extra, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, **(env or {})})

    def done(p: subprocess.Popen) -> tuple[int, str, str]:
        out, err = p.communicate(timeout=150)
        return p.returncode, out, err.strip().splitlines()[-1:] and err.strip().splitlines()[-1]

    code1, text1, _ = done(run([]))
    code2, text2, err2 = done(run(["--tp", str(tp)]))
    world = {"WORLD_SIZE": str(tp), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    procs = [run(["--tp", str(tp)], {**world, "RANK": str(r), "LOCAL_RANK": str(r)}) for r in range(tp)]
    ranks = [done(p) for p in procs]
    return {"kern_run": {"unsplit_exit": code1, "split_exit": code2, "split_same_text": text2 == text1,
                         "split_stderr_tail": err2, "text": text1[:200]},
            "one_process_a_rank": {"exits": [c for c, _, _ in ranks], "same_text": [t == text1 for _, t, _ in ranks],
                                   "stderr_tails": [e for _, _, e in ranks]}}


def prefilled(model, prompt: list[int], cont: list[int]) -> np.ndarray:
    """The last prompt row's logits (one ragged prefill) and each continuation row's (decode)."""
    from kern.drive.raw_pages import raw

    pages = raw(model).take(-(-(len(prompt) + len(cont)) // model.page_tokens))
    try:
        rows = [raw(model).step_rows(prompt, 0, pages, ragged=True)[1]]
        rows += [raw(model).step_rows([t], len(prompt) + i, pages)[1] for i, t in enumerate(cont)]
    finally:
        raw(model).give(pages)
    return np.stack(rows)


COLLECTIVES = ("all_reduce_add_f32", "all_reduce_add_local", "all_gather_f32")


def all_reduce_time(model, batch: int, hidden: int, reps: int = 20) -> dict:
    """The decode step's collective launches alone, each kind in its own graph of `reps` copies
    of every such launch of the step, replayed on every rank at once: the peer all-reduce (reading
    the other ranks' parts, or summing the parts they pushed) and the logits' all-gather, against
    the floor of moving the other ranks' parts over NVLink."""
    eng = model.engine
    st = model.protocol.for_rows(batch, 1)
    vars_ = st.vars_for(batch, batch, reach=64)
    env = eng.ranks[0].env(st.program, vars_)
    ranks = len(eng.ranks)
    out: dict = {"batch": batch, "ranks": ranks}
    for entry in COLLECTIVES:
        n = sum(1 for l in eng.ranks[0].launches[st.program] if l.entry == entry)
        if not n:
            continue

        def lower(r: int, entry=entry):
            e = eng.ranks[r]
            ls = [l for l in e.launches[st.program] if l.entry == entry]
            return e.device.lower(ls * reps, e.buffers, e.states, graph=True)

        progs = eng.workers.each(lower)
        eng.workers.each(lambda r: progs[r].run(env))  # capture and warm
        t0 = time.perf_counter()
        for _ in range(5):
            eng.workers.each(lambda r: progs[r].run(env))
        us = (time.perf_counter() - t0) / (5 * reps * n) * 1e6
        part_bytes = batch * (model.engine.ranks[0].consts["vocab_shard"] if entry == "all_gather_f32" else hidden) * 4
        floor_us = part_bytes * (ranks - 1) / (NVLINK_GB_S * 1e9) * 1e6
        out[entry] = {"per_step": n, "us_each": round(us, 2), "us_per_step": round(us * n, 1),
                      "bytes_across_each": part_bytes * (ranks - 1), "nvlink_floor_us_each": round(floor_us, 3)}
    return out


if __name__ == "__main__":
    sys.exit(main())
