"""Where the megakernel's decode step goes, and cubin variants of it timed side by side with the
per-op graph path, in one run on the GPU.

    python bench/mega_prof.py [--shapes smollm2-135m,llama-3.2-1b] [--batch 1,16] [--new 128]
                              [--variants shipped,prof,NAME=SPEC,...]

Variants of mega.cubin, each swapped into an otherwise identical deployment, as NAME=SOURCE[@SHARED]
(or just SOURCE, named after it):
  shipped    the pinned cubin in models/llama/kernels/cuda/cubins (after `build --record`, this tree's)
  prof       mega.cu built with -DMEGA_PROFILE: thread 0 of each block stamps clock64 around
             every phase; the run reads back mega_prof (a __device__ array of the module) and
             prints, per kind of phase and per decode step, each block's wait (from its previous
             phase's end to the grid barrier passed) and busy time (from there to the phase's
             end), mean and max over the grid, and the arrivals' own cost
  FILE.cubin a cubin (e.g. the shipped one saved before a --record)
  FLAGS      nvcc flags ("-DFOO -DBAR=2") to build mega.cu with
  @SHARED    the launch's dynamic shared memory in bytes instead of the manifest's
Decode figures are the bench/mega.py way: (T(32 + 129) - T(32 + 1)) / 128 a step, so the prompt's
steps cancel; the profile is the difference of the same two launches' buckets. Prints one JSON
line a measurement."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

from decode import run_kern  # (beside this script)
from mega import checkpoint, timed

KINDS = ("embed", "qkv", "qk", "attention", "o", "mlp", "down", "lm_head", "pick", "arrive", "plan")
PROF_BLOCKS = 256  # mega.cu PROF_BLOCKS


def build(variants: list[str], out: Path) -> dict[str, tuple[Path, int | None]]:
    """{name: (mega.cubin, shared_mem override or None)} for each variant."""
    from concurrent.futures import ThreadPoolExecutor

    from kern_models.llama.kernels.cuda import CUBINS

    cubins, shared = {}, {}
    with ThreadPoolExecutor() as pool:  # one nvcc a variant, side by side
        for v in variants:
            name, _, spec = v.partition("=")
            spec, _, smem = (spec or name).partition("@")
            shared[name] = int(smem) if smem else None
            if spec == "shipped":
                cubins[name] = CUBINS.shipped / "mega.cubin"
            elif spec.endswith(".cubin"):
                cubins[name] = Path(spec)
            else:
                extra = ["-DMEGA_PROFILE"] if spec == "prof" else spec.split()
                cubins[name] = pool.submit(CUBINS.compile, CUBINS.folder / "mega.cu", out / name,
                                           shutil.which("nvcc") or "nvcc", tuple(extra))
    return {n: (c if isinstance(c, Path) else c.result(), shared[n]) for n, c in cubins.items()}


def deploy(template: Path, folder: Path, cubin: Path, shared: int | None) -> Path:
    """A copy of the one-kernel deployment `template` with `cubin` as its mega.cubin (repinned)
    and, when given, `shared` bytes of dynamic shared memory for its launches."""
    import hashlib

    shutil.copytree(template, folder)
    shutil.copyfile(cubin, folder / "kernels" / "mega.cubin")
    m = json.loads((folder / "manifest.json").read_text())
    m["modules"]["mega"]["sha256"] = hashlib.sha256(cubin.read_bytes()).hexdigest()
    if shared is not None:
        for op in m["ops"].values():
            for launch in op["impl"]["launches"]:
                if launch.get("module") == "mega":
                    launch["shared_mem"] = shared
    (folder / "manifest.json").write_text(json.dumps(m, indent=1) + "\n")
    return folder / "manifest.json"


def has_prof(mega) -> bool:
    """Whether the loaded mega.cubin is a profile build (has mega_prof)."""
    from kern.runtime.devices.cuda.driver import drv

    return int(drv().cuModuleGetGlobal(mega.engine.device.modules["mega"].handle, b"mega_prof")[0]) == 0


def read_prof(mega) -> np.ndarray:
    from kern.runtime.devices.cuda.driver import call

    dptr, size = call("cuModuleGetGlobal", mega.engine.device.modules["mega"].handle, b"mega_prof")
    host = np.zeros(size // 8, np.uint64)
    call("cuMemcpyDtoH", host.ctypes.data, dptr, size)
    return host


def profile(mega, plist: list[list[int]], new: int) -> dict:
    """Per decode step and kind of phase: wait and busy (us), mean and max over the grid."""
    mega.generate_batch(plist, 1)
    a = read_prof(mega)
    mega.generate_batch(plist, new + 1)
    b = read_prof(mega)
    tail = b[PROF_BLOCKS * len(KINDS) * 2:]
    grid = int(tail[5])
    ns_per_cycle = float(tail[2] - tail[0]) / float(tail[3] - tail[1])
    steps = int(b[PROF_BLOCKS * len(KINDS) * 2 + 4]) - int(a[PROF_BLOCKS * len(KINDS) * 2 + 4])

    def buckets(h):
        return h[:PROF_BLOCKS * len(KINDS) * 2].reshape(PROF_BLOCKS, len(KINDS), 2)[:grid].astype(np.float64)

    d = (buckets(b) - buckets(a)) * ns_per_cycle / 1e3 / steps  # us a step
    kinds = {}
    for k, name in enumerate(KINDS):
        w, busy = d[:, k, 0], d[:, k, 1]
        if w.max() + busy.max() <= 0:
            continue
        kinds[name] = {"wait_mean": round(float(w.mean()), 2), "wait_max": round(float(w.max()), 2),
                       "busy_mean": round(float(busy.mean()), 2), "busy_max": round(float(busy.max()), 2),
                       "busy_argmax_block": int(busy.argmax())}
    total = d.sum(axis=(1, 2))
    return {"steps": steps, "ns_per_cycle": round(ns_per_cycle, 4), "block_step_us_mean": round(float(total.mean()), 1),
            "wait_share": round(float(d[:, :, 0].sum() / d.sum()), 3), "kinds": kinds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="smollm2-135m,llama-3.2-1b")
    ap.add_argument("--batch", default="1,16")
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--variants", default="shipped,prof")
    ap.add_argument("--no-per-op", action="store_true")
    args = ap.parse_args()

    import torch

    from kern.api import Model
    from kern.mega import MegaModel
    from kern_models.llama.generator import generate

    tmp = Path(tempfile.mkdtemp())
    cubins = build(args.variants.split(","), tmp / "cubins")
    print(json.dumps({"gpu": torch.cuda.get_device_name(0), "variants": {k: [str(p), sh] for k, (p, sh) in cubins.items()}}),
          flush=True)
    batches = [int(x) for x in args.batch.split(",")]
    for name in args.shapes.split(","):
        ckpt = checkpoint(name)
        cfg = json.loads((ckpt / "config.json").read_text())
        rng = np.random.default_rng(0)
        prompts = {bt: rng.integers(0, cfg["vocab_size"], (bt, args.prompt)).astype(np.int32) for bt in batches}
        if not args.no_per_op:
            per_op = Model(generate(cfg, tmp / name / "cuda", target="cuda", model=name, context=4096), ckpt,
                           state_budget=4 << 30)
            for bt in batches:
                k = run_kern(per_op, prompts[bt], args.new, 8)
                print(json.dumps({"shape": name, "batch": bt, "variant": "per_op", "tok_s": round(k["tok_s"], 1),
                                  "step_us": round(k["step_ms"] * 1e3, 1)}), flush=True)
            del per_op
        template = generate(cfg, tmp / name / "mega", target="mega", model=name, context=1024).parent
        for v, (cubin, shared) in cubins.items():
            mega = MegaModel(deploy(template, tmp / name / v, cubin, shared), ckpt, sequences=max(batches))
            for bt in batches:
                plist = prompts[bt].tolist()
                t_one, _ = timed(lambda: mega.generate_batch(plist, 1))
                t_more, toks = timed(lambda: mega.generate_batch(plist, args.new + 1))
                step_s = (t_more - t_one) / args.new
                row = {"shape": name, "batch": bt, "variant": v, "tok_s": round(bt / step_s, 1),
                       "step_us": round(step_s * 1e6, 1), "first8": toks[0][:8]}
                if has_prof(mega):
                    row["profile"] = profile(mega, plist, args.new)
                print(json.dumps(row), flush=True)
            del mega
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
