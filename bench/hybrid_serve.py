"""kern serve on a hybrid checkpoint (paged and per-sequence states from one budget), as a user
starts it: no flags but the checkpoint (and --target on a laptop's dry run). Over HTTP
(bench/serve.py): the serve workload (512-token prompts sharing a 256-token system prompt,
128 out) at each --concurrency; then --streams streams at once, /metrics read before, at the
peak and after: every state's pages or slots held, of them cached, and mapped, the chunks of the
one budget each state holds (back at the baseline: held less cached as before the streams); then one `kern run` of the checkpoint. Results are `RESULT {json}` lines on stdout
(bench/kimi_gpu.py's serve step). With --trace, each level's steps from kern serve's trace: how
many of each kind (decode, mixed, prompt) and the wall each paid (bench/trace_steps.py).

    python3 bench/hybrid_serve.py CKPT [--target cpu] [--concurrency 32,128] [--streams 64]
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from trace_steps import read, summarize

ROOT = Path(__file__).resolve().parents[1]
POOL = ("kern_pool_units_held", "kern_pool_units_cached", "kern_pool_units_mapped", "kern_pool_chunks")
SCALARS = ("kern_pool_chunks_total", "kern_running_sequences", "kern_queue_depth", "kern_pool_pages_used")


def emit(**kw) -> None:
    print("RESULT " + json.dumps(kw), flush=True)


def pool(url: str) -> dict:
    """/metrics' pool gauges: {gauge: {label values joined by ',': value}} and the scalars."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict = {}
    for name in POOL:
        out[name] = {",".join(re.findall(r'="([^"]*)"', labels)): float(v)
                     for labels, v in re.findall(rf"^{name}\{{(.*?)\}} (\S+)$", text, re.MULTILINE)}
    for name in SCALARS:
        m = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
        out[name] = float(m.group(1)) if m else None
    return out


def up(url: str, proc: subprocess.Popen, seconds: float) -> bool:
    """The server just started answers /health within `seconds`. A port that already answers
    before it starts belongs to another server (one a killed bench left running): measuring that
    one under this one's name is what this refuses (2026-12-06: a run timed out, its server
    outlived it, and the next run's figures were the old server's)."""
    try:
        urllib.request.urlopen(url + "/health", timeout=2)
        raise SystemExit(f"{url} already answers before this bench's server is up: another server holds the port")
    except OSError:
        pass
    end = time.monotonic() + seconds
    while time.monotonic() < end and proc.poll() is None:
        try:
            urllib.request.urlopen(url + "/health", timeout=2)
            return True
        except OSError:
            time.sleep(0.2)
    return False


def bench(url: str, flags: list[str], timeout: float) -> list[dict]:
    """bench/serve.py's JSON lines (or one {"error"} line)."""
    try:
        p = subprocess.run([sys.executable, str(ROOT / "bench/serve.py"), "--url", url, "--label", "kern", *flags],
                           capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return [{"error": f"serve.py timed out after {timeout} s"}]
    rows = [json.loads(ln) for ln in p.stdout.splitlines() if ln.startswith("{")]
    return rows or [{"error": (p.stderr.strip().splitlines() or ["no output"])[-1][:300]}]


def streams(url: str, n: int, vocab: int, timeout: float) -> dict:
    """n streams at once; /metrics before, at the peak (polled while they run) and once idle."""
    before, peak, stop = pool(url), {}, threading.Event()

    def poll() -> None:
        while not stop.is_set():
            try:
                m = pool(url)
            except OSError:
                continue
            if (m["kern_running_sequences"] or 0) >= (peak.get("kern_running_sequences") or 0):
                peak.update(m)
            time.sleep(0.1)

    t = threading.Thread(target=poll, daemon=True)
    t.start()
    try:
        rows = bench(url, ["--prompt", "64", "--shared", "0", "--output", "32", "--requests", str(n),
                           "--concurrency", str(n), "--warmup", "0", "--vocab", str(vocab)], timeout)
    finally:
        stop.set()
        t.join()
    end = time.monotonic() + 30
    after = pool(url)
    while (after["kern_running_sequences"] or after["kern_queue_depth"]) and time.monotonic() < end:
        time.sleep(0.2)
        after = pool(url)
    chunks = lambda m: m["kern_pool_chunks"]
    one_budget = all(chunks(m) and sum(chunks(m).values()) == m["kern_pool_chunks_total"] for m in (before, after))
    return {"streams": n, "run": rows[-1], "before": before, "peak": peak, "after": after,
            "idle_after": not (after["kern_running_sequences"] or after["kern_queue_depth"]),
            "one_budget": bool(one_budget), "leased_before": leased(before), "leased_after": leased(after),
            "back_to_baseline": leased(before) == leased(after)}


def leased(m: dict) -> dict:
    """Each state's units held by running sequences' leases (held less those only cached prefixes hold)."""
    return {k: v - m["kern_pool_units_cached"].get(k, 0) for k, v in m["kern_pool_units_held"].items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ckpt", type=Path)
    ap.add_argument("--target", default=None, help="passed to kern serve and kern run only when given (a dry run)")
    ap.add_argument("--port", type=int, default=8100)
    ap.add_argument("--step-tokens", type=int, default=None, help="kern serve --step-tokens (default: the deployment's)")
    ap.add_argument("--log", type=Path, default=Path("kern_serve.log"), help="kern serve's output")
    ap.add_argument("--concurrency", default="32,128")
    ap.add_argument("--requests", type=int, default=256, help="requests a concurrency level")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--shared", type=int, default=256)
    ap.add_argument("--output", type=int, default=128)
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--up-s", type=float, default=120, help="kern serve's start-up, at most")
    ap.add_argument("--bench-s", type=float, default=60, help="each serve.py run, at most")
    ap.add_argument("--deadline-s", type=int, default=0, help="stop everything (the server too) after this long")
    ap.add_argument("--trace", type=Path, default=None, help="kern serve --trace FILE: each concurrency level's "
                    "window of it summarized, step kind by step kind (bench/trace_steps.py)")
    args = ap.parse_args()
    if args.deadline_s:  # a caller's timeout kills this process only: stop the server first
        def late(*_):
            raise TimeoutError(f"past the {args.deadline_s} s deadline")
        signal.signal(signal.SIGALRM, late)
        signal.alarm(args.deadline_s)
    target = ["--target", args.target] if args.target else []
    target += ["--step-tokens", str(args.step_tokens)] if args.step_tokens else []
    vocab = json.loads((args.ckpt / "config.json").read_text())["vocab_size"]
    subprocess.run([sys.executable, str(ROOT / "bench/serve.py"), "--prepare", str(args.ckpt)], check=True)
    url = f"http://127.0.0.1:{args.port}"
    log = args.log
    t0 = time.monotonic()
    with log.open("w") as f:
        trace = ["--trace", str(args.trace)] if args.trace else []
        server = subprocess.Popen([sys.executable, "-m", "kern.cli", "serve", str(args.ckpt), "--port", str(args.port),
                                   *target, *trace], stdout=f, stderr=subprocess.STDOUT)
    try:
        if not up(url, server, args.up_s):
            tail = log.read_text().replace("\r", "\n").strip().splitlines()[-5:]
            emit(serve_error=f"kern serve did not come up in {args.up_s} s: " + " | ".join(tail))
        else:
            emit(serve_startup_s=round(time.monotonic() - t0, 1))
            for c in args.concurrency.split(","):
                t_from = time.monotonic()  # the trace's clock (CLOCK_MONOTONIC, one for every process)
                for row in bench(url, ["--prompt", str(args.prompt), "--shared", str(args.shared), "--output",
                                       str(args.output), "--requests", str(args.requests), "--concurrency", c,
                                       "--warmup", "4", "--vocab", str(vocab)], args.bench_s):
                    emit(serve=row)
                if args.trace:
                    emit(trace_steps={"concurrency": int(c), **summarize(read(args.trace), t_from, time.monotonic())})
            emit(streams=streams(url, args.streams, vocab, args.bench_s))
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
    print(log.read_text().replace("\r", "\n").strip().splitlines()[-3:], flush=True)
    t0 = time.monotonic()
    prompt = " ".join(f"w{3 + i * 7 % (vocab - 3)}" for i in range(16))
    try:
        p = subprocess.run([sys.executable, "-m", "kern.cli", "run", str(args.ckpt), "--prompt", prompt,
                            "--max-tokens", "32", *target], capture_output=True, text=True, timeout=args.up_s, check=False)
        emit(run={"rc": p.returncode, "wall_s": round(time.monotonic() - t0, 1), "stdout": p.stdout.strip()[-300:],
                  "stderr_tail": p.stderr.replace("\r", "\n").strip().splitlines()[-3:]})
    except subprocess.TimeoutExpired:
        emit(run={"rc": None, "error": f"kern run timed out after {args.up_s} s"})
    print("SERVE OK", flush=True)
    return 0


if __name__ == "__main__":
    # a caller's `timeout` (SIGTERM) unwinds like an error, so the server this started is stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(main())
