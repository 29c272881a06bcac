"""One device call: install the carried wheels, run the chosen GPU tests and benches, print one
summary. Run on the device machine from the repository root; logs land under $OUT.

    python3 bench/gpu.py --preset tests,decode          the GPU suite, then decode tok/s
    python3 bench/gpu.py --preset final                  GPU suite, all shapes with prefill
    python3 bench/gpu.py --preset variants --variants attention.late_trigger,gemv.residual_late

Presets (comma-separated, run in order):
  tests     every GPU test (pytest tests/cuda -m gpu; --tests narrows it with a -k expression)
  decode    bench/decode.py on --shapes at batch 1 and 16, no prefill, eight steps a sync
  final     bench/decode.py on every shape, prefill of 2,040 tokens and decode at batch 1 and 16
  peers     bench/decode.py with transformers' compiled peer too (static cache, torch.compile)
  step      where a decode step's time goes (bench/profile_step.py)
  split     decode tok/s at each decode attention split of --splits
  reach     decode with the reach var at its bound against the default (the step's reach)
  variants  decode tok/s of this tree, of --base (a models/ tree, e.g. `git archive C models`)
            and of each kernel variant of --variants (models/llama/cuda/table.py VARIANTS)
  fused     the fused decode kernels against the plain ones (tests/cuda/bench_cuda_kernels.py)

Wheels (cuda-bindings, the cuBLAS wheel, ...) are carried to the machine in .whl/ (no network
there): `pip download --only-binary :all: -d .whl ...` here, then pass .whl in the run's carry.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRESETS = ("tests", "decode", "final", "peers", "step", "split", "reach", "variants", "fused")
TWO_SHAPES = "llama-3.2-1b,smollm2-135m"


def install(site: Path) -> dict:
    """pip-install the carried wheels into site; the environment that makes kern, kern_models and
    them importable."""
    wheels = sorted(str(p) for p in (ROOT / ".whl").glob("*.whl"))
    if wheels:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                        "--no-cache-dir", "--upgrade", "--target", str(site), *wheels], check=True)
    return models_env(site, ROOT / "models", Path("/tmp/kern-cache"))


def models_env(site: Path, models: Path, cache: Path) -> dict:
    """An environment whose kern_models is the models/ tree at `models`."""
    link = Path(f"/tmp/km-{hashlib.sha256(str(models).encode()).hexdigest()[:12]}")
    link.mkdir(exist_ok=True)
    if not (link / "kern_models").exists():
        (link / "kern_models").symlink_to(models)
    return {**os.environ, "PYTHONPATH": f"{site}:{ROOT / 'src'}:{link}", "PYTHONUNBUFFERED": "1",
            "KERN_CACHE": str(cache)}


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
        print(f"[{label}: {time.monotonic() - t0:.0f} s]", flush=True)
        return log.read_text()

    def tests(self, k: str | None, timeout: int) -> None:
        cmd = [sys.executable, "-m", "pytest", "tests/cuda", "-m", "gpu", "-q", "-p", "no:cacheprovider"]
        text = self.step("gpu_tests", cmd + (["-k", k] if k else []), timeout)
        tail = [ln for ln in text.splitlines() if ln.strip()][-1:] or ["(no output)"]
        self.summary.append(f"gpu tests: {tail[0]}")

    def decode(self, label: str, flags: list[str], timeout: int, env: dict | None = None) -> None:
        from summary import lines

        text = self.step(label, [sys.executable, "bench/decode.py", *flags], timeout, env)
        self.summary += lines(text.splitlines(), label)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tests,decode", help=f"comma-separated, of {', '.join(PRESETS)}")
    ap.add_argument("--shapes", default=TWO_SHAPES, help="shapes of the decode, split, reach and variants presets")
    ap.add_argument("--tests", default=None, help="a pytest -k expression for the tests preset")
    ap.add_argument("--splits", default="64,128,256")
    ap.add_argument("--variants", default="")
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
    sys.path.insert(0, str(ROOT / "bench"))
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
            for v in filter(None, args.variants.split(",")):
                r.decode(v, [*quick, "--variant", v], args.timeout, {**env, "KERN_CACHE": f"/tmp/kc-{v}"})
        elif p == "fused":
            text = r.step("fused", [sys.executable, "tests/cuda/bench_cuda_kernels.py", "bench_fused"], args.timeout,
                          {**env, "PYTHONPATH": env["PYTHONPATH"] + f":{ROOT / 'tests/cuda'}"})
            r.summary += sorted({ln for ln in text.splitlines() if ln.startswith("fused")})
    (out / "summary.txt").write_text("\n".join(r.summary) + "\n")
    print("\n".join(r.summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
