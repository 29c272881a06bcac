"""KDA's recurrence launch at Kimi-Linear's shape (32 heads of 128): the tokens form (kda.cu
kda_tokens, prefill a token at a time; kda_step, decode), the chunked one (kda.cu kda_chunked,
16-row chunks from a call's first row, the faster build's) and the tensor-core one in chunks
fixed by position (kda_tc.cu kda_tc_head + kda_tc / kda_tc_decode, the default build's).
Cases: prefill of 4 prompts x 512 (positions 0 .. 511 each: fresh sequences; kda_tc_head's
launch finds nothing to do; and from position 8, the states zero: its launch computes 8 rows),
one prompt of 2,048 (a (sequence, head)'s chain of 128 chunks: a serve step's long prompt beside
decode rows waits on it), and decode of 64 rows, once at a row
inside a chunk (position 520: 8 rows kept) and once at a chunk's last row (position 527: the
state moves on). Each: median ms of a CUDA graph replay (Gpu.graph_ms: 3 warm-up, 5 timed;
the launch repeated REPS times in the graph), speed-ups against kda_tokens / kda_step, and the
prefill outputs' max |form - tokens| (bf16). The decode states start at zero (the timing does
not depend on their values). Writes $OUT/kda_tc.json (and prints it).

    python3 -m bench.probes.kda_tc   (from the repository root, on the H200; about a minute)"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from kern_models.kimi_linear.kernels.cuda import CUBINS, table
from tests.cuda.cuda_gpu import Gpu, launch_all, op_launches, report

HEADS, DIM, CONV, LAYERS = 32, 128, 4, 1
REPS = 10
PREFILL = {"tokens": table.ops("tokens")["kda_chunked"], "chunked": table.ops("chunked")["kda_chunked"],
           "tc": table.ops("tc")["kda_chunked"]}
DECODE = {"step": table.ops("tokens")["kda_step"], "tc": table.ops("tc")["kda_step"]}


def bf16(rng, shape) -> np.ndarray:
    f = rng.standard_normal(shape).astype(np.float32)
    return ((f.view(np.uint32) + 0x7FFF + ((f.view(np.uint32) >> 16) & 1)) >> 16).astype(np.uint16)


def slot_bytes() -> int:
    """Every form's slot: the state and window, then kda_tc's kept rows (the others ignore them)."""
    W = HEADS * DIM
    return LAYERS * (HEADS * DIM * DIM + (CONV - 1) * 3 * W + table.KDA_TC_ROWS * table.KDA_TC_C * W) * 4


def timed(gpu, spec: dict, named: dict) -> float:
    one = op_launches(gpu, spec, named)
    launch_all(one, gpu.stream)  # once outside the graph: the shared-memory attributes set
    launches = one * REPS
    gpu.stream.synchronize()
    return gpu.graph_ms(launches, per=REPS)


def prefill(gpu, rng, seqs: int = 4, n: int = 512, start: int = 0) -> dict:
    W, rows = HEADS * DIM, seqs * n
    sb = slot_bytes()
    named = dict(mix=gpu.put(bf16(rng, (rows, 3 * W))), g=gpu.put(-rng.uniform(0.001, 0.6, (rows, W)).astype(np.float32)),
                 b=gpu.put(rng.standard_normal((rows, HEADS)).astype(np.float32)),
                 state=gpu.put(np.zeros(seqs * sb // 4, np.float32)), slot=gpu.put(np.arange(seqs, dtype=np.int32)),
                 cu_seqlens=gpu.put(np.arange(seqs + 1, dtype=np.int32) * n),
                 pos=gpu.put(np.tile(np.arange(start, start + n, dtype=np.int32), seqs)), n_seqs=seqs, layer=0,
                 layers=LAYERS,
                 heads=HEADS, dim=DIM, conv=CONV, slot_bytes=sb, chunk=16, rows=rows,
                 pre=gpu.empty(rows * HEADS * (32 + 2 * DIM) * 4))  # kda_tc_prep's scores (the tc form's)
    out, o = {}, {}
    for form, spec in PREFILL.items():
        named["o"] = gpu.empty(rows * W * 2)
        out[form] = {"ms": round(timed(gpu, spec, named), 4)}
        o[form] = (gpu.get(named["o"], np.uint16, (rows, W)).astype(np.uint32) << 16).view(np.float32)
    for form in ("chunked", "tc"):
        out[form]["speedup_vs_tokens"] = round(out["tokens"]["ms"] / out[form]["ms"], 2)
        out[form]["max_abs_diff_vs_tokens"] = float(np.abs(o[form] - o["tokens"]).max())
    out["max_abs_tokens"] = float(np.abs(o["tokens"]).max())
    return out


def decode(gpu, rng, rows: int, position: int) -> dict:
    W, sb = HEADS * DIM, slot_bytes()
    named = dict(mix=gpu.put(bf16(rng, (rows, 3 * W))), g=gpu.put(-rng.uniform(0.001, 0.6, (rows, W)).astype(np.float32)),
                 b=gpu.put(rng.standard_normal((rows, HEADS)).astype(np.float32)),
                 state=gpu.put(np.zeros(rows * sb // 4, np.float32)), slot=gpu.put(np.arange(rows, dtype=np.int32)),
                 pos=gpu.put(np.full(rows, position, np.int32)), rows=rows, layer=0, layers=LAYERS, heads=HEADS,
                 dim=DIM, conv=CONV, slot_bytes=sb)
    out = {}
    for form, spec in DECODE.items():
        named["o"] = gpu.empty(rows * W * 2)
        out[form] = {"ms": round(timed(gpu, spec, named), 4)}
    out["tc"]["speedup_vs_step"] = round(out["step"]["ms"] / out["tc"]["ms"], 2)
    return out


def main() -> None:
    gpu = Gpu.of_family(CUBINS, Path(tempfile.mkdtemp()))
    rng = np.random.default_rng(0)
    res = {"shape": dict(heads=HEADS, dim=DIM, chunk=table.KDA_TC_C, reps=REPS)}
    res["prefill_4x512"] = prefill(gpu, rng)
    res["prefill_4x512_from8"] = prefill(gpu, rng, start=8)  # continuing mid-chunk: kda_tc_head's 8 rows too
    res["prefill_1x2048"] = prefill(gpu, rng, seqs=1, n=2048)  # one long prompt: a (sequence, head)'s chain of 128 chunks
    res["decode_64_pos520"] = decode(gpu, rng, 64, 520)
    res["decode_64_pos527"] = decode(gpu, rng, 64, 527)
    gpu.close()
    report(res, "kda_tc")


if __name__ == "__main__":
    main()
