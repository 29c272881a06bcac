"""One device call for the megakernel, within a hard cap (the team's final call gives it 140 s):
install the carried wheels, a smoke run (the one-launch-a-phase debug mode, then the fused
kernel, then a timed 32 + 128-token generation), bench/mega.py (the megakernel beside the
per-op graph path and transformers eager), then the gpu-marked tests of tests/mega. Each step
has its own timeout and faulthandler says where a hang sits; summary.txt is rewritten after
every step, so whatever the outer cap kills, what ran is reported. The random checkpoints are
made once, in $MEGA_CKPTS, and shared by the steps.

    python3 bench/mega_gpu.py [--smoke-timeout 30] [--bench-timeout 50] [--tests-timeout 45]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from gpu import Run, install, models_env  # noqa: E402

SMOKE = """
import faulthandler, json, sys, time
faulthandler.dump_traceback_later(int(sys.argv[1]) - 3, exit=True)  # where it hangs, if it does
T0 = time.perf_counter()
def say(*a):
    print(f"[{time.perf_counter() - T0:5.1f} s]", *a, flush=True)
sys.path.insert(0, "bench")
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
    ap.add_argument("--smoke-timeout", type=int, default=30)
    ap.add_argument("--bench-timeout", type=int, default=50)
    ap.add_argument("--tests-timeout", type=int, default=45)
    ap.add_argument("--smoke-only", action="store_true", help="the smoke step alone (a short call)")
    args = ap.parse_args()
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
    text = r.step("smoke", [sys.executable, "-c", SMOKE, str(args.smoke_timeout)], args.smoke_timeout)
    ok = "SMOKE OK" in text
    report([ln for ln in text.splitlines() if ln.startswith(("[", "SMOKE"))]
           or [f"smoke: no output ({text.strip()[-300:]})"])
    if args.smoke_only:
        print("\n".join(r.summary))
        return 0
    if ok:
        text = r.step("bench", [sys.executable, "bench/mega.py"], args.bench_timeout)
        report([ln for ln in text.splitlines() if ln.startswith("{")] or [f"bench: {text.strip()[-300:]}"])
    tests = ["tests/mega", "-m", "gpu"] + ([] if ok else ["-k", "phase or co_resident"])
    text = r.step("tests", [sys.executable, "-m", "pytest", *tests, "-v", "-p", "no:cacheprovider", "-rA",
                            "-o", "faulthandler_timeout=30"], args.tests_timeout)
    report([ln for ln in text.splitlines() if " PASSED" in ln or " FAILED" in ln or " ERROR" in ln]
           + [ln for ln in text.splitlines() if ln.strip()][-1:])
    print("\n".join(r.summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
