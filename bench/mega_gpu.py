"""One device call for the megakernel: install the carried wheels, a smoke run that must end
in seconds (a kernel that hangs stops everything here), the gpu-marked tests of tests/mega,
then bench/mega.py. Every step has a timeout; logs land under $OUT.

    python3 bench/mega_gpu.py [--smoke-timeout 75] [--tests-timeout 80] [--bench-timeout 80] [--bench-args "..."]
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from gpu import Run, install  # noqa: E402

SMOKE = """
import faulthandler, json, sys, tempfile, time
faulthandler.dump_traceback_later(int(sys.argv[1]) - 5, exit=True)  # where it hangs, if it does
from pathlib import Path
T0 = time.perf_counter()
def say(*a):
    print(f"[{time.perf_counter() - T0:6.1f} s]", *a, flush=True)
from kern.mega import MegaModel
from kern_models.llama.generator import generate
from kern_models.llama.random_checkpoint import make
tmp = Path(tempfile.mkdtemp())
ckpt = make("smollm2-135m", tmp / "ckpt", device="cuda", max_positions=1024)
cfg = json.loads((ckpt / "config.json").read_text())
say("checkpoint")
debug = MegaModel(generate(cfg, tmp / "phases", target="mega", model="s", context=1024, phases=True), ckpt)
say("debug mode loaded:", len(debug.engine.launches[debug.decode.program]), "launches a step")
a = debug.decode_step(5, 0)
say("debug decode_step (no grid barrier):", a.shape, float(a.max()), int(a.argmax()))
m = MegaModel(generate(cfg, tmp / "mega", target="mega", model="s", context=1024), ckpt)
say("fused loaded")
b = m.decode_step(5, 0)
say("fused decode_step:", float(b.max()), int(b.argmax()), "bitwise the debug mode:", a.tobytes() == b.tobytes())
toks = m.generate(list(range(1, 33)), 16)
say("generate (one launch):", toks)
t0 = time.perf_counter(); m.generate(list(range(1, 33)), 128); say(f"32 + 128 tokens: {(time.perf_counter() - t0) * 1e3:.1f} ms")
print("SMOKE OK")
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke-timeout", type=int, default=75)
    ap.add_argument("--tests-timeout", type=int, default=80)
    ap.add_argument("--bench-timeout", type=int, default=80)
    ap.add_argument("--bench-args", default="")
    ap.add_argument("--tests", default=None, help="a pytest -k expression")
    args = ap.parse_args()
    out = Path(os.environ.get("OUT", "/tmp/out"))
    out.mkdir(parents=True, exist_ok=True)
    env = install(Path("/tmp/site"))
    r = Run(out, env)
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
    r.summary.append(f"gpu: {gpu}; {time.strftime('%Y-%m-%d %H:%M', time.gmtime())}")
    text = r.step("smoke", [sys.executable, "-c", SMOKE, str(args.smoke_timeout)], args.smoke_timeout)
    r.summary += [ln for ln in text.splitlines() if ln.startswith(("[", "SMOKE"))]
    if "SMOKE OK" in text:
        cmd = [sys.executable, "-m", "pytest", "tests/mega", "-m", "gpu", "-v", "-p", "no:cacheprovider", "-rA",
               "-o", "faulthandler_timeout=40"]
        text = r.step("tests", cmd + (["-k", args.tests] if args.tests else []), args.tests_timeout)
        r.summary += [ln for ln in text.splitlines() if " PASSED" in ln or " FAILED" in ln or " ERROR" in ln]
        r.summary += [ln for ln in text.splitlines() if ln.strip()][-1:]
        text = r.step("bench", [sys.executable, "bench/mega.py", *shlex.split(args.bench_args)], args.bench_timeout)
        r.summary += [ln for ln in text.splitlines() if ln.startswith("{")]
    else:
        r.summary.append("smoke failed: tests and bench skipped (smoke.log)")
    (out / "summary.txt").write_text("\n".join(r.summary) + "\n")
    print("\n".join(r.summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
