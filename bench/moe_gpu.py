"""One device call for the Qwen3-MoE family on one H200, within a hard cap: the real
Qwen3-30B-A3B shape (hidden 2048, 32 query / 4 KV heads of 128, 128 experts, 8 active, expert
width 768, vocabulary 151,936) at reduced depth as a seeded random checkpoint, parity against
transformers, decode speed at batch 1 / 16 / 64.

    python3 bench/moe_gpu.py [--layers 24] [--steps ckpt,kern,ep] [--batch 1,16,64]
                             [--ckpt-timeout 270] [--kern-timeout 270]

Steps, each a process of its own with its own timeout (faulthandler says where a hang sits):
  ckpt  the checkpoint (kern_models.qwen3_moe.random_checkpoint, router and LM head sharpened so
        routing and next tokens are decisive) made on the GPU and saved to $MOE_CKPT; then, from
        the same weights, transformers eager's logits at every position of a few random
        sequences in bf16 and in fp32 (the bf16-vs-fp32 spread is the yardstick below).
  ep    (two GPUs or more; skipped below) the kern step again on an EP=2 deployment: the
        experts split over two GPUs, beside the kern step's EP=1 figures.
  kern  the sm_90a deployment: teacher-forced logits through the narrow decode program (gather
        gemv) and each sequence's prefill (grouped GEMMs) against transformers fp32: KL and
        argmax agreement where the fp32 top-1/top-2 margin is decisive, beside transformers'
        own bf16; then greedy decode tok/s at each --batch (bench/decode.py's run_kern:
        32-token prompts, 128 new tokens, run-ahead 8; batch 64 steps the wide decode program),
        with the bytes a batch-1 token reads and the fraction of the 4.8 TB/s read ceiling.
  bench `kern bench` of the EP=1 deployment on the checkpoint: decode steps of --bench-rows
        sequences of one row each (context 160): where a step's time goes, every op (moe_route,
        the expert gemvs or grouped GEMMs, attention, the linears), into $OUT/bench.log and
        $OUT/bench.json (`--steps ckpt,bench` for it alone).
$OUT/summary.json (every figure) and $OUT/summary.txt (a short table) are rewritten after each
step, so whatever the outer cap kills, what ran is reported; each step's log is $OUT/<step>.log.
Disk: 24 layers are 15.6B parameters, 31 GB of bf16 (the device has 64 GB).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from shared import ROOT, Run, family_args, family_setup, verdict_line, with_bench

READ_TB_S = 4.8  # the H200's HBM3e read bandwidth, the batch-1 ceiling's denominator

CKPT = r"""
import faulthandler, json, sys, time
faulthandler.dump_traceback_later(int(sys.argv[1]) - 5, exit=True)
import numpy as np, torch
from pathlib import Path
from kern_models.qwen3_moe.random_checkpoint import model_of
from kern_models.common.random_checkpoint import reference_logits, word_tokenizer
T0 = time.perf_counter()
def say(*a):
    print(f"[{time.perf_counter() - T0:6.1f} s]", *a, flush=True)
layers, folder, seqs, length = int(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
shape, device = sys.argv[6], sys.argv[7]
torch.set_default_dtype(torch.bfloat16)  # initialise in bf16: 31 GB, not 62
model = model_of(shape, layers=layers, device=device).eval()
n = sum(p.numel() for p in model.parameters())
say(f"model: {layers} layers, {n / 1e9:.2f}B parameters")
model.save_pretrained(folder)
word_tokenizer(model.config.vocab_size).save(str(folder / "tokenizer.json"))
say("saved", sum(f.stat().st_size for f in folder.iterdir()) / 1e9, "GB")
out = reference_logits(model, np.random.default_rng(0).integers(0, model.config.vocab_size, (seqs, length)))
say("bf16 and fp32 logits")
np.savez(folder.parent / "moe-ref.npz", **out)
print("CKPT OK", json.dumps({"params_b": round(n / 1e9, 2), "layers": layers}))
"""

KERN = r"""
import faulthandler, json, sys, time
faulthandler.dump_traceback_later(int(sys.argv[1]) - 5, exit=True)
import numpy as np
from pathlib import Path
from decode import run_kern  # bench/decode.py: the step passes bench/ on PYTHONPATH
from kern.drive.parity import compare
from kern.drive.raw_pages import raw
from kern.api import Model
from kern_models.common.random_checkpoint import judge
from kern_models.qwen3_moe.generator import generate
T0 = time.perf_counter()
def say(*a):
    print(f"[{time.perf_counter() - T0:6.1f} s]", *a, flush=True)
def emit(**kw):
    print("RESULT " + json.dumps(kw), flush=True)
ckpt, batches, read_tb_s = Path(sys.argv[2]), [int(b) for b in sys.argv[3].split(",")], float(sys.argv[5])
cfg = json.loads((ckpt / "config.json").read_text())
ep = int(sys.argv[7])
man = generate(cfg, ckpt.parent / f"deploy-{sys.argv[6]}-ep{ep}", target=sys.argv[6], model="qwen3-moe-random",
               context=1024, ep=ep)
model = Model(man, ckpt, state_budget=8 << 30)
say("loaded")
ref = np.load(ckpt.parent / "moe-ref.npz")
ids, fp32, bf16 = ref["ids"], ref["fp32"], ref["bf16"]
seqs, length = ids.shape

pages = raw(model).take(-(-length // model.page_tokens))
narrow, last = [], []
try:
    for s in range(seqs):
        narrow.append(np.stack([raw(model).step_rows([int(t)], i, pages)[1] for i, t in enumerate(ids[s])]))
        last.append(raw(model).step_rows([int(t) for t in ids[s]], 0, pages, ragged=True)[1])
finally:
    raw(model).give(pages)
narrow = np.concatenate(narrow)
spread = compare(fp32, bf16)
ours = compare(fp32, narrow)
ends = (np.arange(seqs) + 1) * length - 1
wide = compare(fp32[ends], np.stack(last))
hf_last = compare(fp32[ends], bf16[ends])
verdict = judge(spread, ours)
emit(parity={"transformers_bf16_vs_fp32": spread, "kern_decode_vs_fp32": ours,
             "kern_prefill_last_rows_vs_fp32": wide, "transformers_bf16_last_rows_vs_fp32": hf_last, **verdict})
say("parity", verdict)
eng = model.engine
c = eng.consts if ep == 1 else {**eng.consts, "local_experts": eng.consts["experts"]}
q_dim, kv_dim = c["heads"] * c["head_dim"], c["kv_heads"] * c["head_dim"]
attn = c["hidden"] * (q_dim + 2 * kv_dim) + q_dim * c["hidden"]
expert = 3 * c["moe_inter"] * c["hidden"]
sparse = sum(1 for n in eng.m.buffers if n.startswith("experts_down."))  # a rank's manifest names them too
dense = c["layers"] - sparse
per_token = 2 * (c["layers"] * (attn + 2 * c["hidden"]) + sparse * (c["top_k"] * expert + c["experts"] * c["hidden"])
                 + dense * 3 * c.get("inter", 0) * c["hidden"] + c["vocab"] * c["hidden"])
# every batch's prompts start with the same ones: sequence 0's greedy tokens are compared
# across batches (the narrow and wide programs run different kernels on the same sequence)
all_prompts = np.random.default_rng(0).integers(0, c["vocab"], (max(batches), 32)).astype(np.int32)
first = None
for batch in batches:
    try:
        model.protocol.for_rows(batch, 1)
    except Exception as exc:  # the cpu dry run's manifest steps fewer sequences than the cuda one
        say(f"decode batch {batch}: skipped ({exc})")
        continue
    r = run_kern(model, all_prompts[:batch], 128, 8)
    first = first or r["tokens"][0]
    row = {"batch": batch, "program": model.protocol.for_rows(batch, 1).program, "tok_s": round(r["tok_s"], 1),
           "step_ms": round(r["step_ms"], 3), "prefill_ms_per_seq": round(r["prefill_ms"], 2),
           "seq0_first16_same_as_first_batch": r["tokens"][0][:16] == first[:16]}
    if batch == 1:
        row |= {"bytes_per_token_gb": round(per_token / 1e9, 3),
                "read_ceiling_tok_s": round(read_tb_s * 1e12 / per_token, 1),
                "fraction_of_read_ceiling": round(per_token / (r["step_ms"] * 1e-3) / (read_tb_s * 1e12), 3)}
    emit(decode=row)
    say("decode", row)
print("KERN OK")
"""

BENCH = r"""
import json, sys
from pathlib import Path
from kern.bench.report import table
from kern.bench.run import bench
from kern.bench.workload import parse
from kern_models.qwen3_moe.generator import generate
ckpt, target, rows, out = Path(sys.argv[1]), sys.argv[2], sys.argv[3], Path(sys.argv[4])
cfg = json.loads((ckpt / "config.json").read_text())
man = generate(cfg, ckpt.parent / f"deploy-{target}-ep1", target=target, model="qwen3-moe-random", context=1024)
# decode steps of `rows` sequences, one row each (rows = [n] would be one sequence's n-row prefill)
wl = parse(f"samples = 5\n[[sweep]]\ngroups = [{rows}]\nrows = [1]\ncontext = [160]\n", "moe.toml")
doc = bench(man, ckpt, wl, progress=False)
(out / "bench.json").write_text(json.dumps(doc, indent=1) + "\n")
print("\n".join(table(doc)))
for sc in doc["scenarios"]:  # every op, not only the table's first few: where each decode step goes
    print(f"\nevery op, {sc['program']} {sc['groups']} x {sc['rows']}: op, calls, us a step, share, GB/s")
    for o in sc["ops"]:
        gbps = o["bytes"] / o["us"] / 1e3 if o["us"] > 0 else 0.0
        print(f"  {o['op']:<28}{o['calls']:>5}{o['us']:>12.1f}{o['share']:>8.1%}{gbps:>9.1f}")
print("BENCH OK")
"""


def _gpus() -> int:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for ln in out.splitlines() if ln.startswith("GPU "))


def table(s: dict) -> str:
    """The summary as a few lines a person reads."""
    out = [f"gpu: {s.get('gpu')}  layers: {s.get('layers')}  params: {s.get('params_b')}B  {s.get('date')}"]
    for tag in ("", "_ep2"):
        p = s.get("parity" + tag)
        if p:
            for k in ("transformers_bf16_vs_fp32", "kern_decode_vs_fp32", "kern_prefill_last_rows_vs_fp32"):
                v = p[k]
                out.append(f"{k + tag:38s} mean KL {v['mean_kl']:.2e}  p99 {v['p99_kl']:.2e}  argmax agree "
                           f"{v['agree_decisive']:.4f} of {v['decisive']} decisive / {v['rows']}")
            out.append(f"parity{tag}: {verdict_line(p)}")
        for d in s.get("decode" + tag, []):
            extra = (f"  {d['bytes_per_token_gb']} GB/token, {d['fraction_of_read_ceiling']} of the read ceiling"
                     if "bytes_per_token_gb" in d else "")
            out.append(f"decode{tag} batch {d['batch']:3d} ({d['program']}): {d['tok_s']:9.1f} tok/s  "
                       f"{d['step_ms']:.3f} ms/step  seq 0's tokens as at batch 1: "
                       f"{d['seq0_first16_same_as_first_batch']}" + extra)
    out += s.get("notes", [])
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=24, help="decoder layers of the 48 (disk: 1.3 GB a layer)")
    ap.add_argument("--steps", default="ckpt,kern,ep")
    family_args(ap, "qwen3-30b-a3b", "qwen3_moe", "--shape tiny --device cpu --target cpu --batch 1,2 --layers 3",
                seqs=4, length=96)
    ap.add_argument("--ckpt-timeout", type=int, default=270)
    ap.add_argument("--kern-timeout", type=int, default=270)
    ap.add_argument("--ep-timeout", type=int, default=270)
    ap.add_argument("--bench-rows", default="1,16,64", help="bench: decode rows of each scenario")
    ap.add_argument("--bench-timeout", type=int, default=200)
    args = ap.parse_args()
    steps = args.steps.split(",")
    out, env, ckpt, head = family_setup("moe", args.layers)
    r = Run(out, env)
    s: dict = {**head, "decode": [], "notes": []}

    def report() -> None:
        r.report(s, table)

    report()
    ok = True
    if "ckpt" in steps:
        text = r.step("ckpt", [sys.executable, "-c", CKPT, str(args.ckpt_timeout), str(args.layers), str(ckpt),
                               str(args.seqs), str(args.length), args.shape, args.device], args.ckpt_timeout)
        done = [ln for ln in text.splitlines() if ln.startswith("CKPT OK")]
        ok = bool(done)
        if done:
            s.update(json.loads(done[0].removeprefix("CKPT OK ")))
        else:
            s["notes"].append("ckpt failed: " + " | ".join(text.strip().splitlines()[-4:]))
        report()
    gpus = _gpus() if args.target == "cuda" else 8  # cpu ranks are threads
    for step, ep, timeout in (("kern", 1, args.kern_timeout), ("ep", 2, args.ep_timeout)):
        if not ok or step not in steps:
            continue
        if ep > gpus:
            s["notes"].append(f"{step}: skipped, EP={ep} needs {ep} GPUs and {gpus} are visible")
            report()
            continue
        text = r.step(step, [sys.executable, "-c", KERN, str(timeout), str(ckpt), args.batch, str(ROOT),
                             str(READ_TB_S), args.target, str(ep)], timeout, with_bench(r.env))
        tag = "" if ep == 1 else f"_ep{ep}"
        s.setdefault("decode" + tag, [])
        for ln in text.splitlines():
            if ln.startswith("RESULT "):
                got = json.loads(ln.removeprefix("RESULT "))
                if "decode" in got:
                    s["decode" + tag].append(got["decode"])
                else:
                    s["parity" + tag] = got["parity"]
        if "KERN OK" not in text:
            s["notes"].append(f"{step} did not finish: " + " | ".join(text.strip().splitlines()[-4:]))
        report()
    if ok and "bench" in steps:
        text = r.step("bench", [sys.executable, "-c", BENCH, str(ckpt), args.target, args.bench_rows, str(out)],
                      args.bench_timeout)
        if "BENCH OK" not in text:
            s["notes"].append("bench did not finish: " + " | ".join(text.strip().splitlines()[-4:]))
        report()
    print(table(s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
