"""MLA attention's attend launch, CUDA cores (mla.cu mla_attend*) against tensor cores (mla_tc.cu
mla_attend_tc*), at Kimi-Linear's shape (32 heads, kv_lora 512, rope 64, nope 128): prefill of
4 prompts x 512 (positions 0 .. 511 each) and a decode step of 64 rows at context 512 and
4096. Each case: median ms of a CUDA graph replay (Gpu.graph_ms: 3 warm-up, 5 timed; the
launch repeated REPS times in the graph), the tensor-core speed-up, TFLOP/s of the absorbed
form (2 x heads x (576 + 512) a (row, key)), and the max |new - old| of o_lat.

Issue 38's long contexts (tensor cores only: the CUDA-core kernel would take seconds): decode
of 1 and 8 rows at context 32,768 and 131,072 at the deployment's split (MLA_CHUNK) against the
same kernel unsplit (chunk = the context: one block a (row, head group) walks it all, the order
before the split, other bits), and a prefill of 1 x 8,192 at offset 24,576 (positions 24,576 ..
32,767). Each long sequence has its own pages (the 8 rows do not share keys), their contents
a repeated random block. Then the default build's prompt rows in the expanded form (case_x:
mla_gather, the GEMM through kv_b, mla_attend_x, and its wgmma twin mla_attend_x_wg timed beside it,
not in the total) for 4 x 512, 1 x 8,192 at 24,576 and the last 2,048-row chunk of a
131,072-token prompt. Writes $OUT/mla_tc.json (and prints it).

    python3 -m bench.probes.mla_tc   (from the repository root, on the H200; a few minutes)"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from kern_models.common.kernel_table import Op
from kern_models.kimi_linear.kernels.cuda import CUBINS, table
from kern_models.kimi_linear.manifests.cuda import MLA_CHUNK
from tests.cuda.cuda_gpu import Gpu, launch_all, op_launches, report
from tests.kimi_linear import mla_tc_model as M

HEADS, NOPE, ROPE, LORA, PAGE = 32, 128, 64, 512, 64
REPS = 10
FORMS = {"cores": ("mla_attend", "mla_attend_decode"), "tensor": ("mla_attend_tc", "mla_attend_tc_decode")}


class LongCache:
    """M.Cache's layout for long sequences without drawing every row: a random block of BLOCK
    tokens repeated, each sequence on its own shuffled pages."""

    BLOCK = 4096

    def __init__(self, rng, lengths, kv_lora: int, rope: int, page_tokens: int, layers: int = 1):
        self.kv_lora, self.rope, self.width = kv_lora, rope, kv_lora + rope
        self.page_tokens, self.layers = page_tokens, layers
        self.token_bytes = 1 << (layers * self.width * 2 - 1).bit_length()
        self.pages_per_seq = max(-(-n // page_tokens) for n in lengths)
        n_pages = len(lengths) * self.pages_per_seq
        per = self.token_bytes // 2
        base = M.bf16_bits(rng.standard_normal(self.BLOCK * per).astype(np.float32))
        self.bits = np.resize(base, n_pages * page_tokens * per)
        self.table = rng.permutation(n_pages).astype(np.int32).reshape(len(lengths), self.pages_per_seq)


def case(gpu, rng, seqs: int, rows_of, ctx: int, prefill: bool, forms=("cores", "tensor"), chunks=(MLA_CHUNK,),
         reps: int = REPS) -> dict:
    """seqs sequences of ctx cached tokens; rows_of: the (seq, pos) rows of the step; the tensor
    form at each of `chunks` (its split; the first is the one compared)."""
    long = ctx > 4096
    cache = (LongCache if long else M.Cache)(rng, [ctx] * seqs, LORA, ROPE, page_tokens=PAGE, layers=1)
    rows = len(rows_of)
    named = dict(q_lat=gpu.put((rng.standard_normal((rows, HEADS, LORA)) * 0.6).astype(np.float32)),
                 q=gpu.put(M.bf16_bits((rng.standard_normal((rows, HEADS, NOPE + ROPE)) * 0.6).astype(np.float32))),
                 kv=gpu.put(cache.bits), pos=gpu.put(np.asarray([p for _, p in rows_of], np.int32)),
                 pages_per_seq=cache.pages_per_seq, rows=rows, layer=0, layers=cache.layers, heads=HEADS, nope=NOPE,
                 rope=ROPE, kv_lora=LORA, page_tokens=PAGE, token_bytes=cache.token_bytes)
    if prefill:
        named |= dict(page_table=gpu.put(cache.table), n_seqs=seqs,
                      cu_seqlens=gpu.put(np.arange(seqs + 1, dtype=np.int32) * (rows // seqs)),
                      prompt_len=gpu.put(np.zeros(seqs, np.int32)))  # generated rows: the absorbed form times them all
    else:
        named |= dict(page_table=gpu.put(cache.table[[s for s, _ in rows_of]]))
    keys = sum(p + 1 for _, p in rows_of)
    out, o = {}, {}
    runs = [(f, None) for f in forms if f == "cores"] + [("tensor", c) for c in chunks if "tensor" in forms]
    for form, chunk in runs:
        pre, dec = FORMS[form]
        name = form if chunk in (None, chunks[0]) else f"tensor_chunk{chunk}"
        named["o_lat"] = gpu.empty(rows * HEADS * LORA * 4)
        if chunk is not None:
            splits = -(-ctx // chunk)
            named |= dict(chunk=chunk, splits=splits, part_o=gpu.empty(rows * HEADS * splits * LORA * 4),
                          part_ml=gpu.empty(rows * HEADS * splits * 2 * 4),
                          sem=gpu.put(np.zeros(rows * HEADS, np.int32)))
        launches = op_launches(gpu, Op((pre if prefill else dec,)).to_manifest(table.BY_ENTRY), named) * reps
        launch_all(launches[:1], gpu.stream)  # once outside the graph: the shared-memory attribute set
        gpu.stream.synchronize()
        ms = gpu.graph_ms(launches, per=reps)
        o[name] = gpu.get(named["o_lat"], np.float32, (rows, HEADS, LORA))
        out[name] = {"ms": round(ms, 4), "tflops": round(2 * HEADS * (LORA + ROPE + LORA) * keys / ms / 1e9, 2)}
        if chunk is not None:
            out[name]["chunk"] = chunk
    if "cores" in out and "tensor" in out:
        out["speedup"] = round(out["cores"]["ms"] / out["tensor"]["ms"], 2)
        out["max_abs_diff"] = float(np.abs(o["tensor"] - o["cores"]).max())
    for name in [n for n in out if n.startswith("tensor_chunk")]:  # the split against one chunk
        out[name + "_over_split"] = round(out[name]["ms"] / out["tensor"]["ms"], 2)
        out[name]["max_abs_diff"] = float(np.abs(o[name] - o["tensor"]).max())
    return out


def case_x(gpu, rng, seqs: int, rows_of, ctx: int, reps: int = REPS) -> dict:
    """The expanded form of the same prefill rows (every row a prompt row): mla_gather (the keys
    numbered and their latents copied), the GEMM through kv_b into kx (linear_rows), and
    mla_attend_x; ms each, and attend_x's TFLOP/s of the expanded form (2 x heads x (nope + rope +
    v_dim) a (row, key)). Then mla_attend_x_wg, its wgmma twin (not in a build yet), timed the same
    way over the same kx: its ms, TFLOP/s, speed-up, and whether its o has attend_x's bits (it
    should: the same order, op for op)."""
    long = ctx > 4096
    cache = (LongCache if long else M.Cache)(rng, [ctx] * seqs, LORA, ROPE, page_tokens=PAGE, layers=1)
    rows, V = len(rows_of), NOPE
    per_seq = rows // seqs
    keys = sum(max(p for s2, p in rows_of if s2 == s) + 1 for s in range(seqs))
    n_out = HEADS * (NOPE + V)
    cu = np.arange(seqs + 1, dtype=np.int32) * per_seq
    named = dict(q=gpu.put(M.bf16_bits((rng.standard_normal((rows, HEADS, NOPE + ROPE)) * 0.6).astype(np.float32))),
                 kv=gpu.put(cache.bits), pos=gpu.put(np.asarray([p for _, p in rows_of], np.int32)),
                 page_table=gpu.put(cache.table), cu_seqlens=gpu.put(cu), n_seqs=seqs,
                 prompt_len=gpu.put(np.full(seqs, ctx, np.int32)), keys=keys,
                 koff=gpu.empty((seqs + 1) * 4), lat=gpu.empty(keys * LORA * 2), kx=gpu.empty(keys * n_out * 2),
                 o=gpu.empty(rows * HEADS * V * 2), pages_per_seq=cache.pages_per_seq, rows=rows, layer=0,
                 layers=cache.layers, heads=HEADS, nope=NOPE, rope=ROPE, kv_lora=LORA, v_dim=V, page_tokens=PAGE,
                 token_bytes=cache.token_bytes)
    W = gpu.put(M.bf16_bits((rng.standard_normal((n_out, LORA)) / np.sqrt(LORA)).astype(np.float32)))
    ops = table.ops("tc", "tensor")
    gemm = dict(x=named["lat"], W=W, y=named["kx"], rows=keys, N=n_out, K=LORA)
    out = {"keys": keys}
    pairs = sum(p + 1 for _, p in rows_of)
    o = {}
    for name, spec, args in (("gather", ops["mla_gather"], named), ("gemm", ops["linear_rows"], gemm),
                             ("attend_x", Op(("mla_attend_x",)).to_manifest(table.BY_ENTRY), named),
                             ("attend_x_wg", Op(("mla_attend_x_wg",)).to_manifest(table.BY_ENTRY), named)):
        launches = op_launches(gpu, spec, args) * (reps if name != "gemm" else 1)
        launch_all(launches[:len(spec["impl"]["launches"])], gpu.stream)  # outside the graph: attributes set
        gpu.stream.synchronize()
        out[name] = {"ms": round(gpu.graph_ms(launches, per=reps if name != "gemm" else 1), 4)}
        if name.startswith("attend"):
            o[name] = gpu.get(named["o"], np.uint16, (rows, HEADS, V))
    for name in ("attend_x", "attend_x_wg"):
        out[name]["tflops"] = round(2 * HEADS * (NOPE + ROPE + V) * pairs / out[name]["ms"] / 1e9, 2)
    out["attend_x_wg"]["speedup"] = round(out["attend_x"]["ms"] / out["attend_x_wg"]["ms"], 2)
    out["attend_x_wg"]["same_bits"] = bool(np.array_equal(o["attend_x"], o["attend_x_wg"]))
    out["gemm"]["tflops"] = round(2 * keys * n_out * LORA / out["gemm"]["ms"] / 1e9, 2)
    out["total_ms"] = round(sum(out[n]["ms"] for n in ("gather", "gemm", "attend_x")), 4)
    return out


def main() -> None:
    gpu = Gpu.of_family(CUBINS, Path(tempfile.mkdtemp()))
    rng = np.random.default_rng(0)
    res = {"shape": dict(heads=HEADS, nope=NOPE, rope=ROPE, kv_lora=LORA, page_tokens=PAGE)}
    res["prefill_4x512"] = case(gpu, rng, 4, [(s, p) for s in range(4) for p in range(512)], 512, True)
    for ctx in (512, 4096):
        res[f"decode_64_ctx{ctx}"] = case(gpu, rng, 64, [(s, ctx - 1) for s in range(64)], ctx, False)
    # issue 38's long contexts, tensor cores: the split against the unsplit order (chunk = ctx)
    for ctx in (32768, 131072):
        for n in (1, 8):
            res[f"decode_{n}_ctx{ctx}"] = case(gpu, rng, n, [(s, ctx - 1) for s in range(n)], ctx, False,
                                               forms=("tensor",), chunks=(MLA_CHUNK, ctx))
    res["prefill_1x8192_at24576"] = case(gpu, rng, 1, [(0, p) for p in range(24576, 32768)], 32768, True,
                                         forms=("tensor",), reps=1)
    # the default build's prompt rows: the expanded form (mla_gather, the GEMM, mla_attend_x)
    res["expanded_prefill_4x512"] = case_x(gpu, rng, 4, [(s, p) for s in range(4) for p in range(512)], 512)
    res["expanded_prefill_1x8192_at24576"] = case_x(gpu, rng, 1, [(0, p) for p in range(24576, 32768)], 32768, reps=1)
    res["expanded_prefill_1x2048_at129024"] = case_x(gpu, rng, 1, [(0, p) for p in range(129024, 131072)], 131072, reps=1)
    gpu.close()
    report(res, "mla_tc")


if __name__ == "__main__":
    main()
