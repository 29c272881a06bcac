"""How long `kern verify` takes on a big manifest: a 64-layer llama-shaped model (thousands of calls).

    python bench/verify.py [--repeats 30] [--cli-repeats 10] [--json]

Two numbers. In process: parse + verify of the manifest bytes (kern.manifest.verify_text), the
median of --repeats runs after warm-up (target <= 50 ms on a 2-core box), with its parts: JSON
read, typed validation (pydantic), the checks. Whole command: the wall time of `kern verify DIR`
in a fresh interpreter (start-up and imports included), the median of --cli-repeats runs, beside
the bare interpreter start (`python -c pass`) for scale."""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONFIG = {  # llama-shaped, 64 layers (Llama-2/3-70B-like widths)
    "architectures": ["LlamaForCausalLM"], "hidden_size": 8192, "num_hidden_layers": 64,
    "num_attention_heads": 64, "num_key_value_heads": 8, "intermediate_size": 28672, "vocab_size": 128256,
    "max_position_embeddings": 8192,
}


def median_ms(fn, repeats: int) -> tuple[float, list[float]]:
    runs = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        runs.append((time.perf_counter() - t) * 1e3)
    return statistics.median(runs), runs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--cli-repeats", type=int, default=10)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from kern_models.llama.generator import generate

    from kern.manifest import checks
    from kern.manifest.context import build
    from kern.manifest.load import parse
    from kern.manifest.schema import Manifest
    from kern.manifest.verify import verify_text

    out = Path(tempfile.mkdtemp(prefix="kern-bench-verify-"))
    try:
        path = generate(CONFIG, out, model="llama-64-layer-bench")
        data = path.read_bytes()
        r = verify_text(data)
        assert r.verified is not None, r.problems[:5]
        v = r.verified
        for _ in range(3):  # warm-up
            verify_text(data)
        total, runs = median_ms(lambda: verify_text(data), args.repeats)
        raw = json.loads(data)
        m, _ = parse(data)
        ctx = build(m)
        gc.disable()  # as verify_text does
        read_ms, _ = median_ms(lambda: json.loads(data), args.repeats)
        validate_ms, _ = median_ms(lambda: Manifest.model_validate(raw), args.repeats)
        checks_ms, _ = median_ms(lambda: [list(fn(ctx)) for fn in checks.ALL], args.repeats)
        gc.enable()

        kern = shutil.which("kern")
        cmd = [kern] if kern else [sys.executable, "-m", "kern.cli"]
        cli, cli_runs = median_ms(lambda: subprocess.run([*cmd, "verify", str(out)], check=True,
                                                         stdout=subprocess.DEVNULL), args.cli_repeats)
        bare, _ = median_ms(lambda: subprocess.run([sys.executable, "-c", "pass"], check=True), args.cli_repeats)
    finally:
        shutil.rmtree(out, ignore_errors=True)

    result = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "manifest": {"layers": CONFIG["num_hidden_layers"], "bytes": len(data), "programs": len(v.manifest.programs),
                     "calls": v.ncalls, "launches": v.launches, "buffers": len(v.manifest.buffers)},
        "parse_verify_ms_median": round(total, 1),
        "parse_verify_ms_min_max": [round(min(runs), 1), round(max(runs), 1)],
        "parts_ms_median": {"json_read": round(read_ms, 1), "typed_validation": round(validate_ms, 1),
                            "checks": round(checks_ms, 1)},
        "kern_verify_command_wall_ms_median": round(cli, 0),
        "kern_verify_command_wall_ms_min_max": [round(min(cli_runs), 0), round(max(cli_runs), 0)],
        "python_start_ms_median": round(bare, 0),
        "command": " ".join(["kern" if kern else "python -m kern.cli", "verify", "DIR"]),
    }
    if args.json:
        print(json.dumps(result, indent=1))
        return
    mf = result["manifest"]
    print(f"manifest: {mf['layers']} layers, {mf['calls']} calls, {mf['launches']} launches, "
          f"{mf['buffers']} buffers, {mf['bytes'] / 1e6:.2f} MB ({result['machine']})")
    print(f"parse + verify, in process: {total:.1f} ms median of {args.repeats} "
          f"(min {min(runs):.1f}, max {max(runs):.1f}); json {read_ms:.1f}, pydantic {validate_ms:.1f}, "
          f"checks {checks_ms:.1f}")
    print(f"`{result['command']}` wall time: {cli:.0f} ms median of {args.cli_repeats} "
          f"(python start alone: {bare:.0f} ms)")


if __name__ == "__main__":
    main()
