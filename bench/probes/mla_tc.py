"""MLA attention's attend launch, CUDA cores (mla.cu mla_attend*) against tensor cores (mla_tc.cu
mla_attend_tc*), at Kimi-Linear's shape (32 heads, kv_lora 512, rope 64, nope 128): prefill of
4 prompts x 512 (positions 0 .. 511 each) and a decode step of 64 rows at context 512 and
4096. Each case: median ms of a CUDA graph replay (Gpu.graph_ms: 3 warm-up, 5 timed; the
launch repeated REPS times in the graph), the tensor-core speed-up, TFLOP/s of the absorbed
form (2 x heads x (576 + 512) a (row, key)), and the max |new - old| of o_lat. Writes
$OUT/mla_tc.json (and prints it).

    python bench/probes/mla_tc.py   (on the H200; under a minute)"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "cuda"))
sys.path.insert(0, str(ROOT / "tests" / "kimi_linear"))

import mla_tc_model as M  # noqa: E402
from cuda_gpu import Gpu, launch_all, op_launches  # noqa: E402
from cuda_kernel_docs import in_sources  # noqa: E402
from kern.runtime.devices.cuda.driver import open_device  # noqa: E402
from kern_models.common.kernel_table import Op  # noqa: E402
from kern_models.kimi_linear.kernels.cuda import CUBINS, table  # noqa: E402

HEADS, NOPE, ROPE, LORA, PAGE = 32, 128, 64, 512, 64
REPS = 10
FORMS = {"cores": ("mla_attend", "mla_attend_decode"), "tensor": ("mla_attend_tc", "mla_attend_tc_decode")}


def case(gpu, rng, seqs: int, rows_of, ctx: int, prefill: bool) -> dict:
    """seqs sequences of ctx cached tokens; rows_of: the (seq, pos) rows of the step."""
    cache = M.Cache(rng, [ctx] * seqs, LORA, ROPE, page_tokens=PAGE, layers=1)
    rows = len(rows_of)
    named = dict(q_lat=gpu.put((rng.standard_normal((rows, HEADS, LORA)) * 0.6).astype(np.float32)),
                 q=gpu.put(M.bf16_bits((rng.standard_normal((rows, HEADS, NOPE + ROPE)) * 0.6).astype(np.float32))),
                 kv=gpu.put(cache.bits), pos=gpu.put(np.asarray([p for _, p in rows_of], np.int32)),
                 pages_per_seq=cache.pages_per_seq, rows=rows, layer=0, layers=cache.layers, heads=HEADS, nope=NOPE,
                 rope=ROPE, kv_lora=LORA, page_tokens=PAGE, token_bytes=cache.token_bytes)
    if prefill:
        named |= dict(page_table=gpu.put(cache.table), n_seqs=seqs,
                      cu_seqlens=gpu.put(np.arange(seqs + 1, dtype=np.int32) * (rows // seqs)))
    else:
        named |= dict(page_table=gpu.put(cache.table[[s for s, _ in rows_of]]))
    keys = sum(p + 1 for _, p in rows_of)
    out, o = {}, {}
    for form, (pre, dec) in FORMS.items():
        named["o_lat"] = gpu.empty(rows * HEADS * LORA * 4)
        launches = op_launches(gpu, Op((pre if prefill else dec,)).to_manifest(table.BY_ENTRY), named) * REPS
        launch_all(launches[:1], gpu.stream)  # once outside the graph: the shared-memory attribute set
        gpu.stream.synchronize()
        ms = gpu.graph_ms(launches, per=REPS)
        o[form] = gpu.get(named["o_lat"], np.float32, (rows, HEADS, LORA))
        out[form] = {"ms": round(ms, 4), "tflops": round(2 * HEADS * (LORA + ROPE + LORA) * keys / ms / 1e9, 2)}
    out["speedup"] = round(out["cores"]["ms"] / out["tensor"]["ms"], 2)
    out["max_abs_diff"] = float(np.abs(o["tensor"] - o["cores"]).max())
    return out


def main() -> None:
    cubins = Path(tempfile.mkdtemp())
    CUBINS.provide(cubins)
    gpu = Gpu(open_device(0), cubins)
    gpu.docs.update({e: (mod, tuple(p.kind for p in ps)) for e, (mod, ps) in in_sources(CUBINS.folder).items()})
    rng = np.random.default_rng(0)
    res = {"shape": dict(heads=HEADS, nope=NOPE, rope=ROPE, kv_lora=LORA, page_tokens=PAGE)}
    res["prefill_4x512"] = case(gpu, rng, 4, [(s, p) for s in range(4) for p in range(512)], 512, True)
    for ctx in (512, 4096):
        res[f"decode_64_ctx{ctx}"] = case(gpu, rng, 64, [(s, ctx - 1) for s in range(64)], ctx, False)
    gpu.close()
    text = json.dumps(res, indent=1)
    print(text)
    out = Path(os.environ.get("OUT", "."))
    out.mkdir(parents=True, exist_ok=True)
    (out / "mla_tc.json").write_text(text + "\n")


if __name__ == "__main__":
    main()
