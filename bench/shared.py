"""What the bench scripts that make one call on a GPU machine share (bench/gpu.py, the family
scripts bench/moe_gpu.py and bench/kimi_gpu.py, bench/mega_gpu.py, bench/tp.py,
bench/tp_profile.py): installing the carried wheels, the environment that makes this tree's kern
and kern_models importable, a family script's flags and setup, the run's logged steps and its
summary, and importing the repository's own test helpers without putting the root on sys.path.

A bench script is run as `python3 bench/<script>.py` from the repository root, so bench/ is
its sys.path[0] and `from shared import ...` finds this module."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def repo_import(name: str):
    """A module of the repository's own tree by its dotted name (tests.judge.fused): its top
    package loaded from ROOT by path, so its relative imports work, and sys.path unchanged."""
    top = name.split(".")[0]
    if top not in sys.modules:
        spec = importlib.util.spec_from_file_location(top, ROOT / top / "__init__.py",
                                                      submodule_search_locations=[str(ROOT / top)])
        module = importlib.util.module_from_spec(spec)
        sys.modules[top] = module
        spec.loader.exec_module(module)
    return importlib.import_module(name)


def with_bench(env: dict) -> dict:
    """env with bench/ on PYTHONPATH: a `python -c` child that imports a bench module (decode)."""
    return {**env, "PYTHONPATH": f"{env.get('PYTHONPATH', '')}:{ROOT / 'bench'}".lstrip(":")}


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
