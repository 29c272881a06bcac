"""Where a tensor-parallel decode step's time goes, rank by rank (bench/tp.py measures speed).

    python3 bench/tp_profile.py --device                on the device machine: install the carried
                                                        wheels, both phases below (a process each),
                                                        then the tp GPU tests
    python3 bench/tp_profile.py --phase measure|new     one phase in this process (the environment ready)

On one random checkpoint (seeded), batch-1 decode after a prompt, beside TP=1 in the same process.

Phase `measure`: the split as generated beside `before` (the same split with the LM head whole
on every rank, no all-gather):

1. **Each call's time inside the real step** (kern bench's prefixes, src/kern/bench/prefix.py:
   the captured graph cut after each call, each prefix timed whole) for TP=1, and for TP=N on
   every rank at once: every rank runs the same prefixes in the same order from its own thread,
   so the all-reduces inside a prefix pair up across the GPUs as they do in a step.
2. With --solo, **a rank without its collectives** ("solo"): each fan-in projection back to the
   unsplit chain's (gemv_residual in place of gemv_push + all_reduce_add_local, NCCL calls dropped,
   the LM head's slice into the logits). Its step alone on one GPU and every rank's at once (one
   thread a rank, as the split runs): the price of half width with nothing crossing between the
   GPUs. Its logits are wrong (each rank adds only its own part), its timing is not.
3. **Each rank's step on its own clock**: events around each rank's launch of one step (or of
   `ahead` steps), and the host's launch time on each rank's thread (how far apart the threads
   launch: a rank that starts late makes the other wait at the first all-reduce).

Phase `new`, in a process of its own (a fault there cannot take the measurement with it): the
split as generated (parts pushed to every rank and summed locally) beside TP=1: tok/s, whether
the tokens are the same, its clocks and per-call attribution.

One JSON object a line; the per-call tables in $OUT/profile_<shape>_<phase>.json."""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

_COLLECTIVE_OPS = ("all_reduce_add_local", "all_reduce", "all_gather")
_PARTS = ("ar_part.", "ar_push.", "lg_part.")


def solo(m: dict, keep_topology: bool) -> dict:
    """The rank manifest `m` without its collectives (see the top of the file): each part
    projection writes its output where the all-reduce after it would have (gemv_push ->
    gemv_residual into the residual; the LM head's slice into the logits), NCCL all-reduces
    dropped, the barrier's buffers and the collectives module gone; keep_topology False makes it
    an ordinary one-device manifest."""
    m = copy.deepcopy(m)
    for prog in m["programs"].values():
        calls: list[dict] = []
        for c in prog["calls"]:
            if c["op"] == "all_reduce_nccl":
                continue
            if c["op"] in _COLLECTIVE_OPS:
                prev, out = calls[-1], c["args"][4]
                if prev["op"] == "gemv_push":  # x, W, recv, parts, rank, ranks, offset, rows, N, K
                    calls[-1] = {"op": "gemv_residual", "args": [*prev["args"][:2], out, *prev["args"][7:]]}
                else:
                    calls[-1] = {**prev, "args": [
                        {"buf": out["buf"], "shape": a.get("shape") or m["buffers"][a["buf"]]["shape"]}
                        if str(a.get("buf", "")).startswith(_PARTS) else a for a in prev["args"]]}
                continue
            calls.append(c)
        prog["calls"] = calls
    used = {c["op"] for p in m["programs"].values() for c in p["calls"]}
    m["ops"] = {n: op for n, op in m["ops"].items() if n in used}
    m["buffers"] = {n: b for n, b in m["buffers"].items()
                    if not (n.startswith(("ar_", *_PARTS)) or b["kind"] == "peer")}
    mods = {la.get("module") for op in m["ops"].values() for la in op["impl"]["launches"]}
    m["modules"] = {n: mod for n, mod in m["modules"].items() if n in mods}
    for k in ("ranks", "ar_blocks"):
        m["constants"].pop(k, None)
    if not keep_topology:
        m.pop("topology", None)
    return m


def whole_head(m: dict) -> dict:
    """The rank manifest `m` with its LM head whole again (the split before the head was sharded
    by vocabulary: every rank reads all of it and needs no all-gather), to time beside it."""
    m = copy.deepcopy(m)
    if m["constants"].pop("vocab_shard", None) is None:
        return m
    head = m["buffers"]["lm_head"]
    head["shape"] = ["vocab", *head["shape"][1:]]
    for seg in head["bind"]:
        seg.pop("rows", None)
    for prog in m["programs"].values():
        calls: list[dict] = []
        for c in prog["calls"]:
            if c["op"] == "all_gather":
                calls[-1] = {**calls[-1], "args": [
                    {"buf": c["args"][4]["buf"]} if str(a.get("buf", "")).startswith("lg_part.") else
                    {"value": "vocab"} if a.get("value") == "vocab_shard" else a for a in calls[-1]["args"]]}
                continue
            calls.append(c)
        prog["calls"] = calls
    m["ops"].pop("all_gather", None)
    m["buffers"] = {n: b for n, b in m["buffers"].items() if not n.startswith("lg_part.")}
    return m


def variant(split: Path, ranks: int, out: Path, change) -> Path:
    """Every rank manifest of `split` through `change`, in out/ beside split's kernels."""
    out.mkdir(parents=True, exist_ok=True)
    if not (out / "kernels").exists():
        (out / "kernels").symlink_to(split / "kernels")
    for r in range(ranks):
        m = json.loads((split / f"rank{r}.json").read_text())
        (out / f"rank{r}.json").write_text(json.dumps(change(m), indent=1) + "\n")
    return out / "rank0.json"


def solo_deployment(split: Path, unsplit_ops: dict, ranks: int, out: Path) -> Path:
    """Every rank's solo manifest (out/rank{r}.json, the kernels linked) and rank 0's alone
    (out/alone/manifest.json); returns out/rank0.json."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "alone").mkdir(exist_ok=True)
    for d in (out, out / "alone"):
        if not (d / "kernels").exists():
            (d / "kernels").symlink_to(split / "kernels")
    for r in range(ranks):
        m = json.loads((split / f"rank{r}.json").read_text())
        m["ops"].setdefault("gemv_residual", unsplit_ops["gemv_residual"])
        (out / f"rank{r}.json").write_text(json.dumps(solo(m, True), indent=1) + "\n")
        if r == 0:
            (out / "alone" / "manifest.json").write_text(json.dumps(solo(m, False), indent=1) + "\n")
    return out / "rank0.json"


def prepared(model, prompt: list[int]) -> tuple[str, dict]:
    """Prefill `prompt`, then one decode row: the decode program's inputs are in place on every
    rank; the program and vars of the next batch-1 step."""
    from kern.drive.raw_pages import raw

    pages = raw(model).take(-(-(len(prompt) + 64) // model.page_tokens))
    tok, _ = raw(model).step_rows(prompt, 0, pages, ragged=True)
    raw(model).step_rows([tok], len(prompt), pages)
    st = model.protocol.for_rows(1, 1)
    return st.program, st.vars_for(1, 1, reach=len(prompt) + 1)


def engines(model) -> list:
    eng = model.engine
    return list(getattr(eng, "ranks", [eng]))


def on_ranks(model, fn) -> list:
    """fn(rank engine) on every rank's thread at once (a one-device model: here)."""
    eng = model.engine
    if hasattr(eng, "workers"):
        return eng.workers.each(lambda r: fn(eng.ranks[r]))
    return [fn(eng)]


def attribution(model, program: str, vars_: dict, samples: int) -> list[dict]:
    """Each rank's per-call times (median of `samples`) inside the real step, every rank at once."""
    from kern.bench.timers import timer_for

    def one(e) -> dict:
        s = timer_for(e).attribute(program, vars_, samples)
        calls = e.m.programs[program].calls
        rows = []
        for c, ts in zip(calls, s.calls):
            w = next((a.buf for a in c.args if getattr(a, "buf", None) and e.m.buffers[a.buf].kind == "weight"
                      and "norm" not in a.buf and not a.buf.startswith("ln")), None)
            rows.append({"op": c.op, "weight": w, "us": float(np.median(ts))})
        return {"calls": rows, "base_us": float(np.median(s.base)), "step_us": float(np.median(s.step)),
                "sum_us": float(sum(r["us"] for r in rows))}

    return on_ranks(model, one)


def by_op(calls: list[dict]) -> dict[str, dict]:
    """Totals by op (and by the weight's kind for the projections: qkv_w, o_w, ...)."""
    tot: dict[str, list[float]] = defaultdict(list)
    for c in calls:
        key = c["op"] + (f"[{c['weight'].split('.')[0]}]" if c["weight"] else "")
        tot[key].append(c["us"])
    return {k: {"n": len(v), "total_us": round(sum(v), 1), "each_us": round(sum(v) / len(v), 2)}
            for k, v in sorted(tot.items(), key=lambda kv: -sum(kv[1]))}


def rank_clocks(model, program: str, vars_: dict, steps: int, ahead: int) -> dict:
    """Events around each rank's launch of `ahead` steps (one graph launch), `steps` times, and
    the host's launch times: median device ms a step per rank, and the spread of the ranks'
    launch instants (us)."""
    from kern.runtime.devices.cuda.driver import call as drv

    st = model.protocol.for_rows(1, 1)
    tok_in, tok_out, pos_in = st.inputs["token"], st.outputs["tokens"], st.inputs["position"]
    pos = int(vars_["reach"]) - 1

    def one(e) -> tuple[list[float], list[int]]:
        a, b = drv("cuEventCreate", 0), drv("cuEventCreate", 0)
        s = e.device.stream
        ms, launched = [], []
        for _ in range(steps):
            e.device.synchronize()
            launched.append(time.perf_counter_ns())
            drv("cuEventRecord", a, s.handle)
            if ahead == 1:
                e.run(program, vars_)
            else:
                e.run_steps(program, vars_, {pos_in: np.array([pos], np.int32)},
                            [{pos_in: np.array([pos], np.int32)} for _ in range(ahead - 1)],
                            feedback={tok_out: tok_in}, collect=[])
            drv("cuEventRecord", b, s.handle)
            s.synchronize()
            ms.append(drv("cuEventElapsedTime", a, b) / ahead)
        return ms, launched

    got = on_ranks(model, one)
    per = [float(np.median(ms)) for ms, _ in got]
    out = {"ahead": ahead, "device_ms_a_step": [round(x, 4) for x in per]}
    if len(got) > 1:
        t = np.array([ln for _, ln in got], dtype=np.float64)
        spread = (t.max(axis=0) - t.min(axis=0)) / 1e3
        out["launch_spread_us"] = {"p50": round(float(np.median(spread)), 1), "max": round(float(spread.max()), 1)}
    return out


def run_shape(args) -> list[dict]:
    import torch

    from decode import run_kern
    from kern.api import Model
    from kern_models.llama.generator import generate
    from kern_models.common.random_checkpoint import model_of, save

    rows: list[dict] = []

    def emit(row: dict) -> None:
        rows.append(row)
        print(json.dumps(row), flush=True)

    gpu = torch.cuda.get_device_name(0)
    tmp = Path(tempfile.mkdtemp())
    ckpt = Path(args.checkpoint) if args.checkpoint else tmp / "ckpt"
    if not (ckpt / "config.json").is_file():
        ref = model_of(args.shape, device="cuda")
        save(ref, ckpt)
        del ref
        torch.cuda.empty_cache()
    cfg = json.loads((ckpt / "config.json").read_text())
    n = args.tp

    def split(name: str, **kw) -> Path:
        return generate(cfg, tmp / name, target="cuda", model=args.shape, context=args.context, tp=n, **kw)

    one_path = generate(cfg, tmp / "tp1", target="cuda", model=args.shape, context=args.context)
    budget = 2 << 30
    models = {"tp1": Model(one_path, ckpt, state_budget=budget)}
    if args.phase == "measure":  # the split as generated beside the one with the LM head whole
        new = split("new")
        models.update({f"tp{n}_before": Model(variant(new.parent, n, tmp / "before_whole", whole_head), ckpt,
                                              state_budget=budget),
                       f"tp{n}": Model(new, ckpt, state_budget=budget)})
        if args.solo:
            solo0 = solo_deployment(new.parent, json.loads(one_path.read_text())["ops"], n, tmp / "solo")
            models.update({f"solo{n}": Model(solo0, ckpt, state_budget=budget),
                           "solo_alone": Model(solo0.parent / "alone" / "manifest.json", ckpt, state_budget=budget)})
        headline = f"tp{n}"
        clocked = ("tp1", f"tp{n}", *((f"solo{n}",) if args.solo else ()))
        attributed = ("tp1", f"tp{n}", *(("solo_alone",) if args.solo else ()))
        same = (f"tp{n}_before", f"tp{n}")
    else:  # the split as generated (pushed parts), in a process of its own
        models.update({f"tp{n}": Model(split("new"), ckpt, state_budget=budget)})
        headline, clocked, attributed = f"tp{n}", (f"tp{n}",), (f"tp{n}",)
        same = ("tp1", f"tp{n}")
    rng = np.random.default_rng(0)
    prompt = [int(i) for i in rng.integers(0, cfg["vocab_size"], args.prompt)]
    prompts = np.array([prompt], np.int32)
    emit({"shape": args.shape, "gpu": gpu, "tp": n, "phase": args.phase, "models": list(models)})

    # tok/s of each, same run (bench/decode.py's loop: prefill, then decode 128 tokens)
    for ahead in (1, 8):
        r = {name: run_kern(m, prompts, args.new, ahead) for name, m in models.items()}
        row = {"shape": args.shape, "phase": args.phase, "batch": 1, "run_ahead": ahead,
               **{f"{k}_tok_s": round(x["tok_s"], 1) for k, x in r.items()},
               **{f"{k}_step_ms": round(x["step_ms"], 3) for k, x in r.items()},
               "speedup": round(r[headline]["tok_s"] / r["tp1"]["tok_s"], 3)}
        row[f"same_tokens_{same[0]}_{same[1]}"] = r[same[0]]["tokens"] == r[same[1]]["tokens"]
        emit(row)

    out = Path(os.environ.get("OUT", "/tmp/out"))
    out.mkdir(parents=True, exist_ok=True)
    tables: dict = {}

    def save() -> None:  # after each table: a phase cut short by its timeout keeps what it has
        (out / f"profile_{args.shape}_{args.phase}.json").write_text(
            json.dumps({"rows": rows, "tables": tables}, indent=1) + "\n")

    # per-call attribution inside the real step
    for name in attributed:
        program, vars_ = prepared(models[name], prompt)
        ranks = attribution(models[name], program, vars_, args.samples)
        tables[name] = ranks
        for r, t in enumerate(ranks):
            emit({"shape": args.shape, "attribution": name, "rank": r, "step_us": round(t["step_us"], 1),
                  "calls_sum_us": round(t["sum_us"], 1), "base_us": round(t["base_us"], 1),
                  "by_op": by_op(t["calls"])})
        save()

    # each rank's own clock, and the spread of the threads' launches
    for name in clocked:
        program, vars_ = prepared(models[name], prompt)
        for ahead in (1, 8):
            emit({"shape": args.shape, "clocks": name, **rank_clocks(models[name], program, vars_, 30, ahead)})
    save()
    return rows


def device_run(args) -> int:
    """The measurement first (the known kernels), then the new ones in a process of their own (a
    fault there cannot take the measurement with it), then the tp GPU tests; one checkpoint."""
    from shared import Run, install

    out = Path(os.environ.get("OUT", "/tmp/out"))
    out.mkdir(parents=True, exist_ok=True)
    env = install(Path("/tmp/site"))
    run = Run(out, env)
    ckpt = Path(tempfile.mkdtemp()) / "ckpt"
    for phase, timeout in (("measure", args.timeout), ("new", args.new_timeout)):
        cmd = [sys.executable, __file__, "--shape", args.shape, "--tp", str(args.tp), "--samples", str(args.samples),
               "--phase", phase, "--checkpoint", str(ckpt)]
        for ln in run.step(f"tp_profile_{args.shape}_{phase}", cmd, timeout).splitlines():
            if ln.startswith("{") or "rror" in ln:
                print(ln[:4000], flush=True)
    t0 = time.monotonic()
    try:
        tests = subprocess.run([sys.executable, "-m", "pytest", "tests/tp", "-m", "gpu", "-q", "-x", "-p",
                                "no:cacheprovider"], cwd=ROOT, env=env, capture_output=True, text=True,
                               timeout=args.test_timeout)
        text = tests.stdout + tests.stderr
    except subprocess.TimeoutExpired as exc:
        text = f"{exc.stdout or ''}\ntimed out after {args.test_timeout} s"
    (out / "tp_gpu_tests.log").write_text(text)
    tail = [ln for ln in text.strip().splitlines() if ln.strip()]
    print(f"[tp gpu tests: {time.monotonic() - t0:.0f} s] {tail[-1] if tail else '(no output)'}", flush=True)
    if "failed" in text or "rror" in text:
        print("\n".join(tail[-40:]), flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", action="store_true", help="install the carried wheels, run in a subprocess")
    ap.add_argument("--shape", default="llama-3.1-8b")
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--new", type=int, default=96)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--samples", type=int, default=3)
    ap.add_argument("--phase", choices=("measure", "new"), default="measure",
                    help="measure: TP=1, the split and the split with the LM head whole; new: the split alone")
    ap.add_argument("--solo", action="store_true", help="measure: also the split without its collectives")
    ap.add_argument("--checkpoint", default=None, help="the random checkpoint's folder (made there if empty)")
    ap.add_argument("--timeout", type=int, default=125, help="seconds for the measure phase (--device)")
    ap.add_argument("--new-timeout", type=int, default=70, help="seconds for the new phase (--device)")
    ap.add_argument("--test-timeout", type=int, default=35, help="seconds for the tp GPU tests (--device)")
    args = ap.parse_args()
    if args.device:
        return device_run(args)
    run_shape(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
