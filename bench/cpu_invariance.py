"""What batch invariance costs on the CPU: the embedded model (SmolLM2-135M) with the llama cpu
kernels of this tree (each row's reductions in calls whose shape the row alone fixes) beside a
peer kernel module (e.g. the batched-BLAS kernels before), in one process, interleaved.

    git show <rev>:models/llama/kernels/cpu/kernels.py > /tmp/peer.py
    python bench/cpu_invariance.py --peer /tmp/peer.py [--repeats 3]

For each: decode tok/s of one greedy stream (32 new tokens after a chat prompt), the output
tok/s of a batch of 16 such streams, and prefill tok/s of a 256-token prompt. Medians of the
repeats; one JSON line."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path


def deployment(ckpt: Path, kernels: Path | None, root: Path) -> Path:
    """The cpu deployment of ckpt, with its kernel module swapped for `kernels` (re-pinned)."""
    from kern.deployments import deployment_for

    src = deployment_for(ckpt, "cpu").parent
    if kernels is None:
        return src / "manifest.json"
    return swapped(src, "kernels", kernels, root / "peer")


def swapped(src: Path, module: str, kernels: Path, dst: Path) -> Path:
    """The deployment folder src copied to dst with its module `module` replaced by the file
    `kernels` (re-pinned): its manifest's path."""
    if src != dst:
        shutil.copytree(src, dst)
    m = json.loads((dst / "manifest.json").read_text())
    mod = m["modules"][module]
    (dst / mod["source"]).write_bytes(kernels.read_bytes())
    mod["sha256"] = hashlib.sha256(kernels.read_bytes()).hexdigest()
    (dst / "manifest.json").write_text(json.dumps(m))
    return dst / "manifest.json"


def measure(model, ids: list[int], new: int, batch: int = 16) -> dict[str, float]:
    from kern.generation.params import SamplingParams

    one = model.generate(ids, max_tokens=new, ignore_eos=True)
    t = time.perf_counter()
    gens = model.generate_batch([ids[:len(ids) - i] for i in range(batch)],
                                SamplingParams(max_tokens=new, ignore_eos=True))
    wide = sum(len(g.tokens) for g in gens) / (time.perf_counter() - t)
    long = (ids * 64)[:256]
    t = time.perf_counter()
    model.generate(long, max_tokens=1)
    return {"decode_1": one.decode_tok_s, f"batch_{batch}": wide, "prefill_256": 256 / (time.perf_counter() - t)}


def side_by_side(models: dict, ids: list[int], new: int, repeats: int, batch: int = 16) -> dict:
    """Each model measured `repeats` times, interleaved: medians, the first's ratio to the
    second's, the machine."""
    runs: dict[str, list[dict]] = {n: [] for n in models}
    for _ in range(repeats):
        for name, model in models.items():
            model.loop.paging.pool.clear()  # every run computes its prompts (no cached prefix)
            runs[name].append(measure(model, ids, new, batch))
    out = {n: {k: round(statistics.median(r[k] for r in rs), 1) for k in rs[0]} for n, rs in runs.items()}
    first, second = list(out)
    out["ratio"] = {k: round(out[first][k] / out[second][k], 3) for k in out[second]}
    out["machine"] = f"{os.cpu_count()} cores"
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--peer", type=Path, required=True, help="the peer's llama cpu kernel module")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--new", type=int, default=32)
    args = ap.parse_args()

    from kern.api import Model
    from kern_models.embedded import prepare

    ckpt = prepare(progress=False)
    with tempfile.TemporaryDirectory() as tmp:
        models = {name: Model(deployment(ckpt, k, Path(tmp)), ckpt)
                  for name, k in (("invariant", None), ("peer", args.peer))}
        tok = models["invariant"].tokenizer
        ids = tok.encode(tok.chat([{"role": "user", "content":
                                    "Write a short story about a lighthouse keeper and a storm."}]))
        print(json.dumps(side_by_side(models, ids, args.new, args.repeats)))


if __name__ == "__main__":
    main()
