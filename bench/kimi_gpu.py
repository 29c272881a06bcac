"""One device call for the Kimi-Linear family on one H200, within a hard cap: the GPU tests of
tests/kimi_linear (kern test of sm_90a against the cpu reference, the planted kernel bugs), and
the real Kimi-Linear-48B-A3B shape (hidden 2304, KDA 32 heads of 128, MLA 32 heads with
kv_lora 512 + rope 64, 256 experts, 8 active, a shared expert, vocabulary 163,840) at reduced
depth as a seeded random checkpoint: parity against transformers, decode speed beside it.

    python3 bench/kimi_gpu.py [--layers 8] [--steps tests,ckpt,parity,decode,profile,serve] [--batch 1,16,64]

Steps, each a process of its own with its own timeout (the tests run beside ckpt):
  tests  pytest -m gpu tests/kimi_linear (its log: $OUT/tests.log)
  ckpt   the checkpoint (kern_models.kimi_linear.random_checkpoint, sharpened) made on the GPU
         and saved; transformers eager's logits at every position of --seqs random sequences in
         bf16 and fp32 (the bf16-vs-fp32 spread is the yardstick; 8 x 64 tokens give ~500 decisive
         rows, where 3 x 64's ~190 moved the agreement by half a point a row); transformers' greedy decode
         tok/s in bf16 at each --batch (32-token prompts; a run of 1 new token subtracted from
         one of --hf-new, so prefill is not counted)
  parity the sm_90a deployment: teacher-forced logits through the decode program (one token a
         step, the recurrence's one-token step) and each sequence's prefill in one step (the
         chunked recurrence) against transformers fp32: KL and argmax agreement where the fp32
         top-1/top-2 margin is decisive, beside transformers' own bf16 (judged only where that
         spread is judgeable: kern_models.common.random_checkpoint.judge)
  decode greedy decode tok/s at each --batch (32-token prompts, --decode-steps steps, each step's
         tokens read back before the next: no run-ahead), stepped below the host loop
         (kern.drive.raw_pages.greedy: a lease a sequence, its page tables and `slot` inputs
         filled as the host loop fills them), and whether sequence 0's first 16 tokens are
         those it got at the first batch (batch invariance); parity and decode share one
         process (`kern` names both)
  profile (in the kern process) ragged prefill steps of the serve workload (4 prompts of 512
         tokens: its 2,048-row budget; one prompt's 256 uncached rows beside 31 decode rows as
         one ragged step, as the CPU's loop runs a mixed step; that prompt alone, which with a
         decode step of 32 rows is how kern serve runs a mixed step on the device, its decode
         rows on the decode graphs) and each --batch's decode step, each launch's device time summed
         by kernel
  serve  `kern serve` with no flags but the checkpoint (bench/hybrid_serve.py): the serve
         workload at c=32 and c=128, then 64 streams at once with /metrics' pool gauges (pages
         and slots from one budget of chunks) before, at the peak and after; then one `kern run`;
         kern serve's step trace ($OUT/kern_serve.trace) summarized a level at a time: steps
         by kind (decode, mixed, prompt), the wall each paid (bench/trace_steps.py)
  long   the long-context case (bench/kimi_long.py, issue 38 item 3) on each of --long-servers
         in turn, each its own process and timeout: 8 streams of 32,768-token prompts, then one of
         131,072, 64 out, on CKPT-long (these weights, a config of 132,096 positions; made there
         without a checkpoint); TTFT, output tok/s and the state memory a sequence holds,
         measured and computed; $OUT/long_{kern,vllm}.json and long_summary.txt (vLLM from the
         wheels in /tmp/vsite: bench/kimi_long_gpu.sh says which call does what)
--kda-form tc|tokens|chunked: the sm_90a build for parity, decode and profile: the default build
(batch-invariant; its recurrence kda_tc, chunks fixed by position on tensor cores, or with tokens
kda_tokens, decode's step a token at a time) or, with chunked, the faster one
(batch_invariant=False: cuBLASLt, the chunked kernel): calls with --steps ckpt,profile,decode
price one against the other.
$OUT/summary.json and $OUT/summary.txt are rewritten after each step; a step that fails leaves
the others' results there (parity, decode and serve need a checkpoint: this call's ckpt step's
or one an earlier call left in /tmp/kimi/ckpt).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time

from shared import ROOT, Run, family_args, family_setup, verdict_line

# Each step's script starts with this: a traceback where it hangs, timed progress, results a line each.
PREAMBLE = r"""
import faulthandler, json, sys, time
faulthandler.dump_traceback_later(int(sys.argv[1]) - 5, exit=True)
T0 = time.perf_counter()
def say(*a):
    print(f"[{time.perf_counter() - T0:6.1f} s]", *a, flush=True)
def emit(**kw):
    print("RESULT " + json.dumps(kw), flush=True)
"""

CKPT = PREAMBLE + r"""
import numpy as np, torch
from pathlib import Path
from kern_models.kimi_linear.random_checkpoint import model_of, save
from kern_models.common.random_checkpoint import reference_logits
layers, folder, seqs, length = int(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
batches, new, shape, device = [int(b) for b in sys.argv[6].split(",")], int(sys.argv[7]), sys.argv[8], sys.argv[9]
torch.set_default_dtype(torch.bfloat16)
model = model_of(shape, layers=layers, device=device, max_positions=4096).eval()
n = sum(p.numel() for p in model.parameters())
say(f"model: {layers} layers, {n / 1e9:.2f}B parameters")
save(model, folder)
say("saved", round(sum(f.stat().st_size for f in folder.iterdir()) / 1e9, 1), "GB")
emit(params_b=round(n / 1e9, 2))
model.config._attn_implementation = "eager"  # the peer as measured: transformers eager
with torch.no_grad():
    prompts = torch.tensor(np.random.default_rng(1).integers(0, model.config.vocab_size, (max(batches), 32)),
                           device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for b in batches:
        def gen(k):
            sync()
            t0 = time.perf_counter()
            model.generate(prompts[:b], max_new_tokens=k, min_new_tokens=k, do_sample=False)
            sync()
            return time.perf_counter() - t0
        try:
            gen(2)  # warm-up
            t1, tn = gen(1), gen(new)
            emit(hf_decode={"batch": b, "tok_s": round(b * (new - 1) / (tn - t1), 1),
                            "step_ms": round((tn - t1) / (new - 1) * 1e3, 2)})
        except Exception as e:  # noqa: BLE001 - say what failed and go on to the parity logits
            emit(hf_decode={"batch": b, "error": f"{type(e).__name__}: {e}"[:300]})
        say("transformers decode, batch", b)
out = reference_logits(model, np.random.default_rng(0).integers(0, model.config.vocab_size, (seqs, length)))
say("bf16 and fp32 logits")
np.savez(folder.parent / "kimi-ref.npz", **out)
print("CKPT OK")
"""

KERN = PREAMBLE + r"""
import numpy as np
from pathlib import Path
from kern.drive.parity import compare, teacher_forced
from kern.drive.raw_pages import give_many, greedy, lease_many, raw, step_inputs
from kern.manifest import load_verified
from kern.runtime.engine import Engine
from kern_models.common.random_checkpoint import judge
from kern_models.kimi_linear.generator import generate
ckpt, batches, steps = Path(sys.argv[2]), [int(b) for b in sys.argv[3].split(",")], int(sys.argv[4])
parts = sys.argv[6].split(",")
cfg = json.loads((ckpt / "config.json").read_text())
form = sys.argv[7] if len(sys.argv) > 7 else ""  # the prompt recurrence's form ("": the build's default)
# sm_90a's chunked recurrence is the faster build's (the invariant one refuses it)
faster = {"batch_invariant": False} if form == "chunked" and sys.argv[5] != "cpu" else {}
# the cpu build's bounds raised to the steps run here (a dry run: the profile's 2,048 rows and 32
# sequences, the widest batch)
rows = {"tokens": 2048, "seqs": max(32, *batches)} if sys.argv[5] == "cpu" else {}
man = generate(cfg, ckpt.parent / f"deploy{'-' + form if form else ''}", target=sys.argv[5], model="kimi-linear-random",
               context=1024, **({"kda_form": form} if form else {}), **faster, **rows)

class Stepped:  # what kern.drive steps: an engine with its pool
    def __init__(self):
        self.engine = Engine(load_verified(man), ckpt, paged=True, state_budget=16 << 30)
        self.paging, self.protocol = self.engine.paging, self.engine.protocol
        self.page_tokens = self.paging.page_tokens

model = Stepped()
say("loaded")

def check_parity():
    ref = np.load(ckpt.parent / "kimi-ref.npz")
    ids, fp32, bf16 = ref["ids"], ref["fp32"], ref["bf16"]
    seqs, length = ids.shape
    one = np.concatenate([teacher_forced(model, [int(t) for t in ids[s]]) for s in range(seqs)])
    last = []
    for s in range(seqs):
        pages = raw(model).take(-(-length // model.page_tokens))
        try:
            last.append(raw(model).step_rows([int(t) for t in ids[s]], 0, pages, ragged=True)[1])
        finally:
            raw(model).give(pages)
    spread, ours = compare(fp32, bf16), compare(fp32, one)
    ends = (np.arange(seqs) + 1) * length - 1
    verdict = judge(spread, ours)
    emit(parity={"transformers_bf16_vs_fp32": spread, "kern_decode_vs_fp32": ours,
                 "kern_prefill_last_rows_vs_fp32": compare(fp32[ends], np.stack(last)),
                 "transformers_bf16_last_rows_vs_fp32": compare(fp32[ends], bf16[ends]), **verdict})
    say("parity", verdict)

if "parity" in parts:
    try:  # decode's figures come even where parity fails
        check_parity()
    except Exception as e:  # noqa: BLE001
        import traceback; traceback.print_exc()
        emit(parity_error=f"{type(e).__name__}: {e}"[:300])
eng, proto = model.engine, model.protocol
prompts = np.random.default_rng(1).integers(0, cfg["vocab_size"], (max(batches), 32)).astype(np.int32)

def by_kernel(env_of_step, program):  # each launch's device time in one step, summed by kernel
    from kern.runtime.devices.cuda.profile import profile
    if not hasattr(eng.programs[program], "dev"):  # a cpu dry run: the host step alone
        return {"launches": 0, "device_us": 0.0, "by_kernel": {}}
    rows, by = profile(eng.programs[program], env_of_step), {}
    for _, entry, us in rows:
        n, t = by.get(entry, (0, 0.0))
        by[entry] = (n + 1, t + us)
    total = sum(t for _, t in by.values())
    return {"launches": len(rows), "device_us": round(total, 1),
            "by_kernel": {k: {"n": n, "us": round(t, 1), "share": round(t / total, 3)}
                          for k, (n, t) in sorted(by.items(), key=lambda x: -x[1][1])}}

def profile_prefill(label, lengths, starts):  # one ragged prefill step: sequence i's lengths[i] rows from starts[i]
    leases = lease_many(model, len(lengths), max(a + n for a, n in zip(starts, lengths)) + 8)
    try:
        rng = np.random.default_rng(2)
        ids = [rng.integers(0, cfg["vocab_size"], n).tolist() for n in lengths]
        st, vars_, inputs = step_inputs(model, ids, starts, leases, ragged=True)
        times = []
        for _ in range(4):
            t0 = time.perf_counter()
            env = eng.run(st.program, vars_, inputs)
            eng.read(st.outputs["tokens"], env)
            times.append(time.perf_counter() - t0)
        emit(profile={"step": label, "program": st.program,
                      "host_step_ms": round(float(np.median(times[1:])) * 1e3, 2), **by_kernel(env, st.program)})
    finally:
        give_many(model, leases)

if "profile" in parts:
    try:  # decode's figures come even where the profile fails
        # the serve workload's prompt step: 4 prompts of 512 fill the 2,048-row budget
        profile_prefill("prefill 4 x 512", [512] * 4, [0] * 4)
        # and its mixed step at 32 streams (a third of its steps, bench/loop_steps.py): one
        # successor's 256 uncached rows after the cached shared half, beside 31 decode rows
        # (one each, mid-reply) on the prefill program
        profile_prefill("mixed 256 + 31 decode rows", [256] + [1] * 31, [256] + [400] * 31)
        # the same prompt alone: with a 32-row decode step beside it (the decode rows kept on the
        # decode program, issue 38's alternative) against the mixed step as one program
        profile_prefill("prompt 256 alone", [256], [256])
        say("prefill profiled")
    except Exception as e:  # noqa: BLE001
        import traceback; traceback.print_exc()
        emit(profile_error=f"{type(e).__name__}: {e}"[:300])

# Each batch's sequences on leases of their own, their page tables and slots filled as the host
# loop fills them (kern.drive.raw_pages.greedy); sequence 0's tokens must not depend on the batch.
first = None
for b in (batches if "decode" in parts else []):
    g = greedy(model, prompts[:b], steps)
    warm = sorted(g.step_s[4:])  # the first steps capture the graphs
    step = float(np.median(warm))
    seq0 = [int(t) for t in g.tokens[:, 0]]
    first = first or seq0
    row = {"batch": b, "program": g.program, "tok_s": round(b / step, 1), "step_ms": round(step * 1e3, 3),
           "prefill_ms": round(g.prefill_s * 1e3, 1), "seq0_same_as_first_batch": seq0[:16] == first[:16]}
    emit(decode=row)
    say("decode", row)
    if "profile" in parts:  # every batch: where a narrow step (a serve at 16-32 streams) spends differs from the widest
        emit(profile={"step": f"decode {b} rows", "program": g.program, "host_step_ms": row["step_ms"],
                      **by_kernel(g.env, g.program)})
print("KERN OK")
"""


def table(s: dict) -> str:
    out = [f"gpu: {s.get('gpu')}  layers: {s.get('layers')}  params: {s.get('params_b')}B  {s.get('date')}",
           f"tests: {s.get('tests')}"]
    p = s.get("parity")
    if p:
        for k in ("transformers_bf16_vs_fp32", "kern_decode_vs_fp32", "kern_prefill_last_rows_vs_fp32",
                  "transformers_bf16_last_rows_vs_fp32"):
            v = p[k]
            out.append(f"{k:38s} mean KL {v['mean_kl']:.2e}  p99 {v['p99_kl']:.2e}  max {v['max_kl']:.2e}  argmax "
                       f"agree {v['agree_decisive']:.4f} of {v['decisive']} decisive / {v['rows']}")
        out.append(f"parity: {verdict_line(p)}")
    for k in ("parity_error", "profile_error"):
        if k in s:
            out.append(f"{k.split('_')[0]} failed: {s[k]}")
    for d in s.get("decode", []):
        out.append(f"kern decode batch {d['batch']:3d} ({d['program']}): {d['tok_s']:9.1f} tok/s  {d['step_ms']:.3f} "
                   f"ms/step  prefill {d['prefill_ms']} ms  seq 0 as at the first batch: {d['seq0_same_as_first_batch']}")
    for p in s.get("profile", []):
        top = ", ".join(f"{k} {v['us']:.0f} us ({v['share']:.0%})" for k, v in list(p["by_kernel"].items())[:8])
        out.append(f"kern {p['step']} ({p['program']}): host step {p['host_step_ms']} ms, device {p['device_us']:.0f} "
                   f"us in {p['launches']} launches: {top}")
    for d in s.get("hf_decode", []):
        out.append(f"transformers bf16 decode batch {d['batch']:3d}: " +
                   (f"{d['tok_s']:9.1f} tok/s  {d['step_ms']} ms/step" if "tok_s" in d else d["error"]))
    if "serve_startup_s" in s:
        out.append(f"kern serve (no flags) up in {s['serve_startup_s']} s")
    for d in s.get("serve", []):
        out.append(f"serve c={d.get('concurrency')}: " + (
            f"{d['output_throughput']} tok/s out, {d['request_throughput']} req/s, {d['completed']}/{d['requests']} "
            f"done, TTFT p50 {d['ttft_ms']['p50']} ms, TPOT p50 {d['tpot_ms']['p50']} ms" if "error" not in d
            else d["error"]))
    for d in s.get("trace_steps", []):  # hybrid_serve.py --trace: each level's steps by kind
        out.append(f"serve c={d['concurrency']} steps (kern serve's trace; timed {d['timed_s']} s): " + "; ".join(
            f"{n} {k['steps']} at {k['ms_a_step']} ms (p50 {k['ms_a_step_p50']}), {k['prompt_rows_a_step']} prompt + "
            f"{k['decode_rows_a_step']} decode rows, {k['share']:.0%}" for n, k in d["kinds"].items()))
    st = s.get("streams")
    if st:
        held = lambda m: m.get("kern_pool_units_held")  # noqa: E731
        out += [f"{st['streams']} streams at once: {st['run'].get('completed')} done, idle after: {st['idle_after']}, "
                f"every state's chunks from one budget: {st['one_budget']}, leases back to the baseline: "
                f"{st['back_to_baseline']} (leased before {st['leased_before']}, after {st['leased_after']})",
                f"  units held before {held(st['before'])}, at the peak {held(st['peak'])} "
                f"({st['peak'].get('kern_running_sequences')} running), after {held(st['after'])}",
                f"  chunks before {st['before']['kern_pool_chunks']}, at the peak {st['peak'].get('kern_pool_chunks')}, "
                f"after {st['after']['kern_pool_chunks']} of {st['after']['kern_pool_chunks_total']}"]
    if "run" in s:
        out.append(f"kern run: rc {s['run'].get('rc')} in {s['run'].get('wall_s')} s: {s['run'].get('stdout', '')[:120]!r}"
                   + (f" {s['run'].get('error') or s['run'].get('stderr_tail')}" if s["run"].get("rc") != 0 else ""))
    return "\n".join(out + s.get("notes", []))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=8, help="decoder layers of the 27 (MLA at 4 and 8 of the first 8)")
    ap.add_argument("--steps", default="tests,ckpt,parity,decode,serve")
    family_args(ap, "kimi-linear-48b-a3b", "kimi_linear",
                "--shape tiny --device cpu --target cpu --steps ckpt,kern --layers 4", seqs=8, length=64)
    ap.add_argument("--decode-steps", type=int, default=24)
    ap.add_argument("--hf-new", type=int, default=8, help="transformers: new tokens a timed run")
    ap.add_argument("--tests-timeout", type=int, default=150)
    ap.add_argument("--ckpt-timeout", type=int, default=120)
    ap.add_argument("--kern-timeout", type=int, default=100)
    ap.add_argument("--serve-timeout", type=int, default=240)
    ap.add_argument("--long-servers", default="kern", help="the long step's servers in turn: kern, vllm or both")
    ap.add_argument("--long-timeout", type=int, default=560, help="the long step's, each server's")
    ap.add_argument("--long-flags", default="", help="bench/kimi_long.py's own flags (a dry run's: "
                                                      "'--target cpu --cases 2x1500,1x3000 --output 16')")
    ap.add_argument("--kda-form", default="", choices=["", "chunked", "tokens", "tc"],
                    help="the prompt recurrence's form for parity, decode and profile (default: the build's own)")
    ap.add_argument("--serve-flags", default="", help="bench/hybrid_serve.py's own flags (a dry run's lighter "
                                                      "workload, e.g. '--requests 16 --prompt 48 --shared 16')")
    args = ap.parse_args()
    steps = args.steps.replace("kern", "parity,decode").split(",")
    out, env, ckpt, head = family_setup("kimi", args.layers)
    r = Run(out, env)
    s: dict = {**head, "decode": [], "hf_decode": [], "serve": [], "trace_steps": [], "profile": [], "long": [], "notes": []}

    def report() -> None:
        r.report(s, table)

    def collect(text: str, label: str, done: str) -> bool:
        """A step's RESULT lines into the summary (appended where the summary keeps a list), a
        note where it did not print `done`; whether it did."""
        for ln in text.splitlines():
            if ln.startswith("RESULT "):
                for k, v in json.loads(ln.removeprefix("RESULT ")).items():
                    s[k].append(v) if isinstance(s.get(k), list) else s.update({k: v})
        if done not in text:
            s["notes"].append(f"{label} did not finish: " + " | ".join(text.strip().splitlines()[-6:]))
        report()
        return done in text

    tests, t0 = None, time.monotonic()
    if "tests" in steps:  # beside the checkpoint's making (disk and host bound): the tiny model's GPU tests
        log = (out / "tests.log").open("w")
        tests = subprocess.Popen([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "-rfEs",
                                  "tests/kimi_linear"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    report()
    ok = True
    if "ckpt" in steps:
        text = r.step("ckpt", [sys.executable, "-c", CKPT, str(args.ckpt_timeout), str(args.layers), str(ckpt),
                               str(args.seqs), str(args.length), args.batch, str(args.hf_new), args.shape,
                               args.device], args.ckpt_timeout)
        ok = collect(text, "ckpt", "CKPT OK")
    if tests is not None:
        try:
            tests.wait(timeout=max(1, args.tests_timeout - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            tests.kill()
            s["notes"].append(f"tests: timed out after {args.tests_timeout} s")
        tail = [ln for ln in (out / "tests.log").read_text().splitlines() if ln.strip()][-1:] or ["(no output)"]
        s["tests"] = tail[0]
        report()
    ok = ok and (ckpt / "config.json").is_file()
    parts = [p for p in ("parity", "decode", "profile") if p in steps]
    if ok and parts:
        text = r.step("kern", [sys.executable, "-c", KERN, str(args.kern_timeout), str(ckpt), args.batch,
                               str(args.decode_steps), args.target, ",".join(parts), args.kda_form], args.kern_timeout)
        collect(text, "kern", "KERN OK")
    if ok and "serve" in steps:
        flags = (["--target", args.target] if args.target != "cuda" else []) + shlex.split(args.serve_flags)
        text = r.step("serve", [sys.executable, str(ROOT / "bench/hybrid_serve.py"), str(ckpt), "--log",
                                str(out / "kern_serve.log"), "--trace", str(out / "kern_serve.trace"), "--deadline-s",
                                str(args.serve_timeout - 10), *flags],
                      args.serve_timeout)
        collect(text, "serve", "SERVE OK")
    if "long" in steps and ("ckpt" not in steps or ok):  # without a checkpoint kimi_long makes its own
        for server in args.long_servers.split(","):
            text = r.step(f"long_{server}", [sys.executable, str(ROOT / "bench/kimi_long.py"), str(ckpt), "--server",
                                             server, "--out", str(out), "--layers", str(args.layers), "--shape",
                                             args.shape, "--device", args.device, "--deadline-s",
                                             str(args.long_timeout - 10), *shlex.split(args.long_flags)],
                          args.long_timeout)
            collect(text, f"long ({server})", f"LONG OK ({server})")
        done = subprocess.run([sys.executable, str(ROOT / "bench/kimi_long.py"), "--table", str(out)],
                              capture_output=True, text=True, cwd=ROOT, env=env)
        s["notes"] += done.stdout.strip().splitlines() or [f"the long table: {done.stderr.strip()[-300:]}"]
        report()
    if not ok and steps != ["long"]:
        s["notes"].append(f"no checkpoint in {ckpt}: parity, decode and serve not run")
        report()
    print(table(s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
