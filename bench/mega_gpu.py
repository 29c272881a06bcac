"""One device call for the megakernel, within a hard cap (the team's final call gives it 140 s):
install the carried wheels, then the steps of --steps in order:
  build  save the pinned mega.cubin as /tmp/mega-base.cubin, then build this tree's mega.cu and
         record it as the pinned one (on the device only: the later steps then load it without
         building it again, and prof can time base=/tmp/mega-base.cubin beside it)
  smoke  the one-launch-a-phase debug mode, then the fused kernel, then a timed 32 + 128-token
         generation
  bench  bench/mega.py: the megakernel beside the per-op graph path and transformers eager
  prof   bench/mega_prof.py: where a decode step's time goes (the profile build), and the
         shipped cubin, this tree's and --prof-args' variants beside the per-op path
  tests  the gpu-marked tests of tests/mega
Each step has its own timeout and faulthandler says where a hang sits; summary.txt is rewritten
after every step, so whatever the outer cap kills, what ran is reported. The random checkpoints
are made once, in $MEGA_CKPTS, and shared by the steps.

    python3 bench/mega_gpu.py [--steps smoke,bench,tests] [--build-timeout 60] [--smoke-timeout 30] [--bench-timeout 50]
                              [--prof-timeout 90[,90...]] [--prof-args "..." ...] [--tests-timeout 45]
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from shared import ROOT, Run, install, models_env

SMOKE = """
import faulthandler, json, sys, time
faulthandler.dump_traceback_later(int(sys.argv[1]) - 3, exit=True)  # where it hangs, if it does
T0 = time.perf_counter()
def say(*a):
    print(f"[{time.perf_counter() - T0:5.1f} s]", *a, flush=True)
from mega import checkpoint
from kern.mega import MegaModel
from kern_models.llama.generator import generate
ckpt = checkpoint("smollm2-135m")
cfg = json.loads((ckpt / "config.json").read_text())
say("checkpoint")
out = ckpt.parent / "smoke"
debug = MegaModel(generate(cfg, out / "phases", target="mega", model="s", context=1024, phases=True), ckpt)
say("debug mode:", len(debug.engine.launches[debug.decode.program]), "launches a step")
a = debug.decode_step(5, 0)
say("debug decode_step (no grid barrier): argmax", int(a.argmax()), "max", float(a.max()))
m = MegaModel(generate(cfg, out / "mega", target="mega", model="s", context=1024), ckpt)
b = m.decode_step(5, 0)
say("fused decode_step: argmax", int(b.argmax()), "bitwise the debug mode:", a.tobytes() == b.tobytes())
say("generate (one launch):", m.generate(list(range(1, 33)), 16))
for new in (1, 129):
    m.generate(list(range(1, 33)), new)
    t0 = time.perf_counter(); m.generate(list(range(1, 33)), new); t = time.perf_counter() - t0
    say(f"32 + {new} tokens in one launch: {t * 1e3:.2f} ms")
print("SMOKE OK")
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build-timeout", type=int, default=60)
    ap.add_argument("--smoke-timeout", type=int, default=30)
    ap.add_argument("--bench-timeout", type=int, default=50)
    ap.add_argument("--prof-timeout", default="90", help="seconds, a run of bench/mega_prof.py (comma-separated: "
                                                             "one a --prof-args, the last for the rest)")
    ap.add_argument("--prof-args", action="append", default=[],
                    help="bench/mega_prof.py's arguments (shell words); again for another run of it, in its own "
                         "step (prof, prof2, ...)")
    ap.add_argument("--tests-timeout", type=int, default=45)
    ap.add_argument("--steps", default="smoke,bench,tests", help="of build, smoke, bench, prof, tests; in this order")
    args = ap.parse_args()
    steps = set(args.steps.split(","))
    out = Path(os.environ.get("OUT", "/tmp/out"))
    out.mkdir(parents=True, exist_ok=True)
    # Another preset of the same call may be running from /tmp/site: use it as it is when its
    # wheels are in (no rewrite under a running process), else install into a site of our own.
    shared = Path("/tmp/site")
    env = (models_env(shared, ROOT / "models", Path("/tmp/kern-cache-mega")) if (shared / "cuda").is_dir()
           else install(Path("/tmp/site-mega")))
    env["MEGA_CKPTS"] = "/tmp/mega-ckpts"
    r = Run(out, env)
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
    r.summary.append(f"gpu: {gpu}; {time.strftime('%Y-%m-%d %H:%M', time.gmtime())}")

    def report(lines: list[str]) -> None:
        r.summary += lines
        (out / "summary.txt").write_text("\n".join(r.summary) + "\n")

    report([])
    ok = True
    if "build" in steps:
        shutil.copyfile(ROOT / "models/llama/kernels/cuda/cubins/mega.cubin", "/tmp/mega-base.cubin")
        text = r.step("build", [sys.executable, "-m", "kern_models.common.cubins", "llama", "/tmp/mega-build", "--record"],
                      args.build_timeout)
        ok = "recorded" in text
        report([ln for ln in text.splitlines() if ln.strip()][-2:])
    if "smoke" in steps:
        text = r.step("smoke", [sys.executable, "-c", SMOKE, str(args.smoke_timeout)], args.smoke_timeout,
                      cwd=ROOT / "bench")  # beside mega.py, which the smoke imports
        ok = "SMOKE OK" in text
        report([ln for ln in text.splitlines() if ln.startswith(("[", "SMOKE"))]
               or [f"smoke: no output ({text.strip()[-300:]})"])
    runs = args.prof_args or [""]
    caps = [int(c) for c in args.prof_timeout.split(",")]
    for step, cmd, timeout in (("bench", ["bench/mega.py"], args.bench_timeout),
                               *((f"prof{i + 1 if i else ''}", ["bench/mega_prof.py", *shlex.split(a)],
                                  caps[min(i, len(caps) - 1)]) for i, a in enumerate(runs))):
        if ok and step.rstrip("0123456789") in steps:
            text = r.step(step, [sys.executable, *cmd], timeout)
            report([ln for ln in text.splitlines() if ln.startswith("{")] or [f"{step}: {text.strip()[-300:]}"])
    if "tests" in steps:
        tests = ["tests/mega", "-m", "gpu"] + ([] if ok else ["-k", "phase or co_resident"])
        text = r.step("tests", [sys.executable, "-m", "pytest", *tests, "-v", "-p", "no:cacheprovider", "-rA",
                                "-o", "faulthandler_timeout=30"], args.tests_timeout)
        report([ln for ln in text.splitlines() if " PASSED" in ln or " FAILED" in ln or " ERROR" in ln]
               + [ln for ln in text.splitlines() if ln.strip()][-1:])
    print("\n".join(r.summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
