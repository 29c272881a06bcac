"""kern bench, kern cut and kern kernels on the GPU, as a user runs them: the evidence of the
toolset in one device call (`python3 bench/gpu.py --preset toolset` installs kern from this
tree and runs this script with it).

For each shape (SmolLM2-135M and Llama-3.2-1B, seeded random checkpoints, sm_90a deployments
at context 4096): `kern bench` at batch 1 and 16, contexts 128 and 2,048 (JSON, table and the
chart as PNG and SVG under --out); `kern cut --stages 2`, then `kern test` of the stages
against the uncut manifest. Then `kern kernels --rebuild` of the shipped sm_90a example.
Prints one `toolset ...` line per finding."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHAPES = ("smollm2-135m", "llama-3.2-1b")
WORKLOAD = """samples = 10
seed = 0

[[sweep]]
groups = [1, 16]
rows = [1]
context = [128, 2048]
"""


def kern(out: Path, label: str, args: list[str], timeout: int) -> tuple[int, str]:
    """`python -m kern.cli ARGS`, its output kept in out/<label>.txt."""
    t0 = time.monotonic()
    try:
        p = subprocess.run([sys.executable, "-m", "kern.cli", *args], capture_output=True, text=True, timeout=timeout)
        rc, text = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired:
        rc, text = 124, f"timed out after {timeout} s"
    (out / f"{label}.txt").write_text(text)
    print(f"[{label}: exit {rc}, {time.monotonic() - t0:.0f} s]", flush=True)
    return rc, text


def last(text: str) -> str:
    return ([ln for ln in text.splitlines() if ln.strip()] or ["(no output)"])[-1]


def bench_lines(name: str, doc: dict) -> list[str]:
    out = [f"toolset bench {name}: {doc['device']['name']} (driver {doc['device']['driver']}), copy ceiling "
           f"{doc['ceiling_gbps']:.0f} GB/s, state budget {doc['state_budget'] >> 20} MiB, "
           f"dropped {[(d['groups'], d['rows'], d['context'], d['why']) for d in doc['dropped']]}"]
    for sc in doc["scenarios"]:
        st, ck = sc["step"], sc["step"]["check"]
        ops = ", ".join(f"{o['op']} {o['us']:.0f} us {o['share']:.0%}" for o in sc["ops"][:4])
        out.append(f"toolset bench {name} {sc['groups']}x{sc['rows']} @{sc['context']}: step p50 "
                   f"{st['untraced_us']['p50']:.1f} us (p10 {st['untraced_us']['p10']:.1f}, p90 "
                   f"{st['untraced_us']['p90']:.1f}; host {st['host_us']['p50']:.1f}); {sc['program_calls']} calls sum "
                   f"{ck['calls_us']:.1f} us = {ck['ratio']:.2%} of the step ({'within' if ck['ok'] else 'NOT within'} "
                   f"5%); base {st['base_us']['p50']:.1f} us; {ops}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    args = ap.parse_args()
    import importlib.util

    import torch
    from kern_models.llama.generator import generate
    from kern_models.common.random_checkpoint import make

    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp())
    wl = tmp / "workload.toml"
    wl.write_text(WORKLOAD)
    charts = importlib.util.find_spec("matplotlib") is not None
    lines = [] if charts else ["toolset: matplotlib is not installed here: no charts (carry its wheel)"]
    for name in args.shapes.split(","):
        ckpt = make(name, tmp / name / "ckpt", device="cuda")
        torch.cuda.empty_cache()
        deploy = generate(json.loads((ckpt / "config.json").read_text()), tmp / name / "deploy", target="cuda",
                          model=name, context=4096).parent
        js = out / f"bench-{name}.json"
        rc, text = kern(out, f"bench-{name}", ["bench", str(deploy), "--weights", str(ckpt), "--workload", str(wl),
                                               "--json", str(js)]
                        + (["--chart", str(out / f"bench-{name}.png")] if charts else []), 240)
        if rc == 0 and js.is_file():
            doc = json.loads(js.read_text())
            lines += bench_lines(name, doc)
            if charts:
                from kern.bench.report import chart

                chart(doc, out / f"bench-{name}.svg")
        else:
            lines.append(f"toolset bench {name}: exit {rc}: {last(text)}")
        stages = tmp / name / "stages"
        rc, text = kern(out, f"cut-{name}", ["cut", str(deploy), "--stages", "2", "--out", str(stages)], 120)
        lines.append(f"toolset cut {name}: exit {rc}: {' | '.join(text.strip().splitlines())}")
        if rc == 0:
            rc, text = kern(out, f"test-cut-{name}", ["test", "--reference", str(deploy), "--candidate", str(stages),
                                                      "--weights", str(ckpt)], 240)
            e2e = [ln.strip() for ln in text.splitlines() if "end to end" in ln]
            lines.append(f"toolset kern test {name} cut vs uncut: exit {rc}: {last(text)} ({'; '.join(e2e)})")
    example = ROOT / "examples" / "smollm2-135m-instruct-sm90a"
    rc, text = kern(out, "kernels-rebuild", ["kernels", str(example), "--rebuild"], 300)
    lines.append(f"toolset kernels --rebuild {example.name}: exit {rc}: {last(text)}")
    print("\n".join(lines), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
