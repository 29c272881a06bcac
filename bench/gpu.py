"""One call on a GPU machine: install the carried wheels, run the chosen GPU tests and benches,
print one summary. Run on that machine from the repository root; logs land in the folder $OUT
names (the shared setup: bench/shared.py).

    python3 bench/gpu.py --preset tests,decode          the GPU suite, then decode tok/s
    python3 bench/gpu.py --preset final                  GPU suite, all shapes with prefill
    python3 bench/gpu.py --preset variants --base /tmp/base/models

Presets (comma-separated, run in order):
  tests     every GPU test (pytest tests/cuda -m gpu; --tests narrows it with a -k expression)
  decode    bench/decode.py on --shapes at batch 1 and 16, no prefill, eight steps a sync
  final     bench/decode.py on every shape, prefill of 2,040 tokens and decode at batch 1 and 16
  peers     bench/decode.py with transformers' compiled peer too (static cache, torch.compile)
  step      where a decode step's time goes (bench/profile_step.py)
  split     decode tok/s at each decode attention split of --splits
  reach     decode with the reach var at its bound against the default (the step's reach)
  variants  decode tok/s of this tree and of --base (a models/ tree, e.g. `git archive C models`)
  fused     the fused decode kernels against the plain ones (tests/cuda/bench_cuda_kernels.py)
  embedded  kern installed as a user installs it, the real embedded model (its wheel joined in
            /tmp/smol beforehand): kern run's first byte and decode tok/s, cold then warm
            (bench/first_token.py), beside bench/decode.py's batch-1 SmolLM2-135M figure, then
            kern test of the sm_90a deployment against the cpu one on those weights
  serve     kern serve (no flags) against a peer over HTTP (bench/serve_gpu.sh; PEER=vllm|transformers|none,
            SERVE_S its time limit)
  speculative  one stream, the real embedded model (its wheel joined in /tmp/smol beforehand):
            kern serve plain and --speculate ngram:K beside vLLM plain and with its n-gram
            speculation, bench/speculative.py's editing and summarising workloads over HTTP
            (bench/speculative_gpu.sh; PEER=vllm|none, K, SPECULATIVE_S its time limit)
  crossover the gemv decode program against the wide one at each batch both hold (bench/crossover.py;
            CROSSOVER its arguments)
  toolset   kern installed as a user installs it: kern bench, kern cut + kern test of the stages and
            kern kernels --rebuild (bench/toolset_gpu.py), then the gpu tests of tests/bench and tests/cut
  verdict   kern test across devices on the real embedded model (its wheel joined in /tmp/smol
            beforehand): `kern test` of the sm_90a deployment against the cpu one, timed (cold,
            then once more), the reference's phases profiled
            (bench/kern_test_profile.py), then tests/judge/test_cuda_vs_cpu.py (the PASS and
            the planted sm_90a bugs) and tests/cuda/test_cuda_gpu_kern_test.py

Wheels (cuda-bindings, the cuBLAS wheel, ...) are carried to the machine in .whl/ (no network
there): `pip download --only-binary :all: -d .whl ...` here, then pass .whl in the run's carry.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from shared import ROOT, Run, install, installed_env, models_env

PRESETS = ("tests", "decode", "final", "peers", "step", "split", "reach", "variants", "fused", "embedded", "serve",
           "toolset", "verdict", "crossover", "speculative")
TWO_SHAPES = "llama-3.2-1b,smollm2-135m"


DEPLOYMENTS = """
from kern.deployments import default_model, deployment_for
ckpt = default_model(progress=False)
print(ckpt, deployment_for(ckpt, "cpu").parent, deployment_for(ckpt, "cuda").parent)
"""


def verdict(r: Run, site: Path, env: dict) -> None:
    """`kern test` of the sm_90a deployment against the cpu one as a user runs it (timed: the
    first, cold run is the figure; then once more, for its spread; then with --max-prompt 65, a
    smaller workload priced for its decisive rows), where the reference's
    seconds go (bench/kern_test_profile.py), then tests/judge/test_cuda_vs_cpu.py (the PASS and
    the planted sm_90a bugs) and tests/cuda/test_cuda_gpu_kern_test.py; about 80 s in all."""
    cache = Path("/tmp/kern-cache-verdict")
    emb = installed_env(site, cache)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    r.summary.append(f"host: {os.cpu_count()} cpus, {cpus} usable, load {os.getloadavg()}")
    paths = r.step("deployments", [sys.executable, "-c", DEPLOYMENTS], 30, emb, cwd=Path("/tmp")).split()
    if len(paths) == 3:
        ckpt, cpu, cuda = paths
        # the third: a smaller workload (~25% fewer prefill rows), priced for its time and its decisive
        # rows against the real candidate (docs/perf-history.md, 2026-12-02 evening)
        runs = [("kern_test", []), ("kern_test_again", []), ("kern_test_max_prompt_65", ["--max-prompt", "65"])]
        for label, extra in runs:
            t0 = time.monotonic()
            text = r.step(label, [sys.executable, "-m", "kern.cli", "test", "--reference", cpu, "--candidate",
                                  cuda, "--weights", ckpt, "--time-cap", "25", *extra], 35, emb, cwd=Path("/tmp"))
            lines = [ln for ln in text.splitlines() if ln.strip()]
            r.summary += [f"{label}: {ln}" for ln in lines if ln.startswith(("time:", "end to end:", "wide:"))]
            r.summary.append(f"{label} cpu vs sm_90a, real embedded weights: {(lines or ['(no output)'])[-1]} "
                             f"({time.monotonic() - t0:.1f} s)")
        text = r.step("profile", [sys.executable, str(ROOT / "bench/kern_test_profile.py"), "--reference", cpu,
                                  "--candidate", cuda, "--weights", ckpt], 120, emb, cwd=Path("/tmp"))
        r.summary += [ln for ln in text.splitlines() if ln.startswith(("#", "##"))]
    tenv = {**env, "KERN_CACHE": str(cache), "PIP_FIND_LINKS": "/tmp/smol", "PIP_NO_INDEX": "1"}
    text = r.step("harness_gpu", [sys.executable, "-m", "pytest", "tests/judge/test_cuda_vs_cpu.py",
                                  "tests/cuda/test_cuda_gpu_kern_test.py", "-m", "gpu", "-q", "-s", "-p",
                                  "no:cacheprovider"], 100, tenv)
    r.summary += [ln for ln in text.splitlines() if ln.startswith(("PASS", "FAIL", "INCONCLUSIVE", "wall"))]
    r.summary += [ln for ln in text.splitlines() if ln.strip()][-1:]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tests,decode", help=f"comma-separated, of {', '.join(PRESETS)}")
    ap.add_argument("--shapes", default=TWO_SHAPES, help="shapes of the decode, split, reach and variants presets")
    ap.add_argument("--tests", default=None, help="a pytest -k expression for the tests preset")
    ap.add_argument("--splits", default="64,128,256")
    ap.add_argument("--base", default=None, help="a models/ tree to compare with (variants preset)")
    ap.add_argument("--timeout", type=int, default=170, help="seconds a step")
    args = ap.parse_args()
    presets = args.preset.split(",")
    if bad := [p for p in presets if p not in PRESETS]:
        print(f"--preset: unknown {', '.join(bad)} (presets: {', '.join(PRESETS)})")
        return 2
    out = Path(os.environ.get("OUT", "/tmp/out"))
    out.mkdir(parents=True, exist_ok=True)
    site = Path("/tmp/site")
    env = install(site)
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
    r = Run(out, env)
    r.summary.append(f"gpu: {gpu}; presets {args.preset}; {time.strftime('%Y-%m-%d', time.gmtime())}")
    quick = ["--shapes", args.shapes, "--batch", "1,16", "--prefill", "0", "--run-ahead", "8"]
    for p in presets:
        if p == "tests":
            r.tests(args.tests, args.timeout)
        elif p == "decode":
            r.decode("decode", quick, args.timeout)
        elif p == "final":
            r.decode("final", ["--batch", "1,16", "--new", "128", "--prefill", "2040", "--run-ahead", "8"], args.timeout)
        elif p == "peers":
            r.decode("peers", ["--batch", "1,16", "--new", "128", "--prefill", "0", "--compiled"], 540)
        elif p == "step":
            text = r.step("profile", [sys.executable, "profile_step.py", "--shapes", args.shapes, "--batch", "1,16",
                                      "--context", "96"], args.timeout, cwd=ROOT / "bench")
            r.summary += [ln for ln in text.splitlines() if ln.startswith("{")]
        elif p == "split":
            for s in args.splits.split(","):
                r.decode(f"split{s}", [*quick, "--decode-split", s], args.timeout)
        elif p == "reach":
            r.decode("bound", [*quick, "--no-reach"], args.timeout)
            r.decode("reach", quick, args.timeout)
        elif p == "variants":
            if args.base:
                r.decode("base", quick, args.timeout, models_env(site, Path(args.base).resolve(), Path("/tmp/kc-base")))
            r.decode("new", quick, args.timeout)
        elif p == "fused":
            text = r.step("fused", [sys.executable, "-m", "tests.cuda.bench_cuda_kernels", "bench_fused"], args.timeout,
                          env)  # run from ROOT, which -m puts first on sys.path
            r.summary += sorted({ln for ln in text.splitlines() if ln.startswith("fused")})
        elif p == "embedded":
            emb = installed_env(site, Path("/tmp/kern-cache-embedded"))
            text = r.step("first_token", [sys.executable, str(ROOT / "bench/first_token.py"), "--runs", "3",
                                          "--max-tokens", "256", "--target", "cuda", "--api"], 400, emb, cwd=Path("/tmp"))
            r.summary += [ln for ln in text.splitlines() if ln.startswith(("{", "first_token"))]
            r.decode("engine_b1", ["--shapes", "smollm2-135m", "--batch", "1", "--prefill", "0", "--run-ahead", "8"],
                     args.timeout)
            paths = r.step("deployments", [sys.executable, "-c", DEPLOYMENTS], 120, emb, cwd=Path("/tmp")).split()
            if len(paths) == 3:
                ckpt, cpu, cuda = paths
                t0 = time.monotonic()
                text = r.step("kern_test", [sys.executable, "-m", "kern.cli", "test", "--reference", cpu, "--candidate",
                                            cuda, "--weights", ckpt], 300, emb, cwd=Path("/tmp"))
                tail = [ln for ln in text.splitlines() if ln.strip()][-1:] or ["(no output)"]
                r.summary.append(f"kern test cpu vs sm_90a, real embedded weights: {tail[0]} "
                                 f"({time.monotonic() - t0:.1f} s)")
        elif p == "toolset":
            text = r.step("toolset", [sys.executable, str(ROOT / "bench/toolset_gpu.py"), "--out", str(out)], 560,
                          installed_env(site, Path("/tmp/kern-cache-toolset")), cwd=Path("/tmp"))
            r.summary += [ln for ln in text.splitlines() if ln.startswith("toolset")]
            text = r.step("toolset_tests", [sys.executable, "-m", "pytest", "tests/bench", "tests/cut", "-m", "gpu",
                                            "-q", "-s", "-p", "no:cacheprovider"], args.timeout)
            r.summary += [ln for ln in text.splitlines() if " @ " in ln or "PASS" in ln or "FAIL" in ln]
            r.summary.append(f"toolset gpu tests: {([ln for ln in text.splitlines() if ln.strip()] or ['(none)'])[-1]}")
        elif p == "verdict":
            verdict(r, site, env)
        elif p == "serve":
            emb = installed_env(site, Path("/tmp/kern-cache-serve"))
            text = r.step("serve", ["bash", str(ROOT / "bench/serve_gpu.sh")], int(os.environ.get("SERVE_S", 560)), emb)
            r.summary += [ln for ln in text.splitlines() if ln.startswith(("{", " {", "["))]
        elif p == "speculative":
            emb = installed_env(site, Path("/tmp/kern-cache-embedded"))
            text = r.step("speculative", ["bash", str(ROOT / "bench/speculative_gpu.sh")],
                          int(os.environ.get("SPECULATIVE_S", 580)), emb)
            r.summary += [ln for ln in text.splitlines() if ln.startswith(("{", "kern_speculative"))]
        elif p == "crossover":
            text = r.step("crossover", [sys.executable, "bench/crossover.py", *os.environ.get("CROSSOVER", "").split()],
                          args.timeout)
            r.summary += [ln for ln in text.splitlines() if ln.startswith("{")]
    (out / "summary.txt").write_text("\n".join(r.summary) + "\n")
    print("\n".join(r.summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
