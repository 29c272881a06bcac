"""The llama family as one kernel on sm_90a: the per-op manifest (manifest_cuda.py) with its
decode program replaced by one cooperative launch of mega.cu, and a `generate` program that runs
a whole greedy generation (prompt chunks, then fed-back tokens) in that one launch.

The prefill program stays the per-op one (cuBLASLt projections, flash prefill attention): a
long prompt is compute-bound and the megakernel's gemv tiles are not. Buffer and program names
match the per-op manifest, so kern test judges this manifest against it span by span; the
decode program is one span.

The kernel reads its weights through a pointers buffer (`mega_weights`, filled by the runtime
at load): per layer ln1, qkv_w, o_w, ln2, gate_up_w, down_w, then embed, final_norm, lm_head
(mega.cu's PER_LAYER / GLOBALS). Its grid is one block a multiprocessor (`sms`, 132 on an
H100/H200 SXM), one resident block each at 256 threads: the runtime refuses a grid the
occupancy API says cannot be co-resident, which is what keeps the grid barrier from hanging."""

from __future__ import annotations

from ..config import ConfigError, Shape
from . import cuda as manifest_cuda
from kern_models.common.manifest_parts import buffer, buffer_arg, value_arg

SMS = 132             # H100 / H200 SXM multiprocessors: one block each
THREADS = 256         # mega.cu MEGA_THREADS
MAX_ROWS = 64         # mega.cu MEGA_MAX_ROWS: rows a step (prompt chunks of every sequence)
MAX_SEQS = 32         # mega.cu MEGA_MAX_SEQS
MAX_CHUNK = 8         # prompt tokens a sequence consumes a step, at most
MAX_SPLITS = 16       # mega.cu ATT_MAX_SPLITS: attention's context splits a row
# dynamic shared memory: mega.cu MEGA_SMEM_BYTES (the staged rows, partial sums, sums of squares)
SMEM_BYTES = 8 * (2 * 8 * (256 + 32) * 2 + 2 * 4 * 32 * 4) + 8 * 8 * 4 * 4
PHASES_PER_LAYER = 5  # qkv, attention, o, mlp, down
LAYER_WEIGHTS = ("ln1", "qkv_w", "o_w", "ln2", "gate_up_w", "down_w")
QK_WEIGHTS = ("q_norm", "k_norm")  # after a layer's others, with q/k norms (Qwen3)
GLOBAL_WEIGHTS = ("embed", "final_norm", "lm_head")

PARAMS = (
    "wt: in buffer<u64>", "kv_state: inout state", "page_table: in buffer<i32>", "ids: in buffer<i32>",
    "pos: in buffer<i32>", "cu_seqlens: in buffer<i32>", "rope: in buffer<f32>", "x: out buffer<bf16>",
    "qkv: out buffer<bf16>", "attn: out buffer<bf16>", "act: out buffer<bf16>", "part_o: out buffer<f32>",
    "part_ml: out buffer<f32>", "sem: inout buffer<i32>", "logits: out buffer<f32>", "arg_val: out buffer<f32>",
    "arg_idx: out buffer<i32>", "tokens: out buffer<i32>", "bar: inout buffer<u32>",
    *(f"{n}: i32" for n in ("n_seqs", "pages_per_seq", "n_layers", "hidden", "inter", "n_q_heads", "n_kv_heads",
                            "head_dim", "page_tokens", "vocab", "qk_norm", "chunk", "max_new", "max_steps",
                            "phase_lo", "phase_hi")),
    "eps: f32",
)


def n_phases(layers: int, qk_norm: bool = False) -> int:
    """embed, five a layer (six with q/k norms), LM head (with each block's argmax), the pick
    (mega.cu's phase numbers)."""
    return 1 + (PHASES_PER_LAYER + qk_norm) * layers + 2


def check_shape(s: Shape) -> None:
    problems = []
    if s.head_dim not in (64, 128):
        problems.append(f"head_dim {s.head_dim}: the megakernel's attention takes 64 or 128")
    if s.heads // s.kv_heads > 8:
        problems.append(f"{s.heads // s.kv_heads} query heads a kv head: the megakernel takes at most 8")
    if problems:
        raise ConfigError("cannot build the sm_90a megakernel manifest: " + "; ".join(problems))


def _call(s: Shape, seqs: str, tokens: str, logits: str, chunk, max_new, max_steps, lo: int, hi: int,
          ids: str, pos: str, cu: str, page_table: str) -> dict:
    pages = {"ceil_div": ["context", "page_tokens"]}
    return {"op": "mega_step", "args": [
        buffer_arg("mega_weights"), {"state": "kv"}, buffer_arg(page_table), buffer_arg(ids), buffer_arg(pos), buffer_arg(cu), buffer_arg("rope"), buffer_arg("mega_x"),
        buffer_arg("mega_qkv"), buffer_arg("mega_attn"), buffer_arg("mega_act"), buffer_arg("mega_part_o"), buffer_arg("mega_part_ml"), buffer_arg("mega_sem"), buffer_arg(logits),
        buffer_arg("mega_argmax_val"), buffer_arg("mega_argmax_idx"), buffer_arg(tokens), buffer_arg("mega_bar"), value_arg(seqs), value_arg(pages), value_arg("layers"),
        value_arg("hidden"), value_arg("inter"), value_arg("heads"), value_arg("kv_heads"), value_arg("head_dim"), value_arg("page_tokens"), value_arg("vocab"),
        value_arg(int(s.qk_norm)), value_arg(chunk),
        value_arg(max_new), value_arg(max_steps), value_arg(lo), value_arg(hi), value_arg(s.eps)]}


def build(s: Shape, model: str, *, sms: int = SMS, phases: bool = False, graph: bool = False,
          context: int | None = None, **limits) -> dict:
    """phases: the debug mode, the decode program as one launch a phase (the same bits).
    graph: capture the decode program as a CUDA graph (its one launch and the input copies)."""
    check_shape(s)
    if sms < 1:
        raise ConfigError(f"sms {sms}: the megakernel's grid needs at least one block")
    # the megakernel steps up to 32 sequences faster than the wide program's GEMMs (docs/megakernel.md),
    # past the per-op gemv program's crossover
    m = manifest_cuda.build(s, model, context=context, batch_invariant=False,
                            **{"seqs": manifest_cuda.DECODE_SEQS, **limits})
    if m["vars"]["seqs"]["max"] > MAX_SEQS:
        raise ConfigError(f"seqs {m['vars']['seqs']['max']}: the megakernel steps at most {MAX_SEQS} sequences")
    bufs = m["buffers"]
    bw = lambda shape, dtype="bf16": buffer(shape, "workspace", dtype)
    per_layer = LAYER_WEIGHTS + (QK_WEIGHTS if s.qk_norm else ())
    entries = [f"{w}.{l}" for l in range(s.layers) for w in per_layer] + list(GLOBAL_WEIGHTS)
    bufs.update({
        "mega_weights": {"kind": "pointers", "dtype": "u64", "shape": [len(entries)], "entries": entries},
        "mega_x": bw([MAX_ROWS, "hidden"]), "mega_qkv": bw([MAX_ROWS, "qkv_dim"]),
        "mega_attn": bw([MAX_ROWS, "q_dim"]), "mega_act": bw([MAX_ROWS, "inter"]),
        # attention's split partials; sem counts a (row, kv head)'s splits, zero between phases
        "mega_part_o": bw([MAX_ROWS, "heads", MAX_SPLITS, "head_dim"], "f32"),
        "mega_part_ml": bw([MAX_ROWS, "heads", MAX_SPLITS, 2], "f32"),
        "mega_sem": buffer([MAX_ROWS, "kv_heads"], "carry", "i32"),
        # each block's maximum of each row's logits
        "mega_argmax_val": bw([MAX_SEQS, sms], "f32"), "mega_argmax_idx": bw([MAX_SEQS, sms], "i32"),
        # the grid barrier's arrival and leaving counters: zero at load, zero again after every launch
        "mega_bar": buffer([2], "carry", "u32"),
    })
    decode_io = dict(ids="d_ids", pos="d_pos", cu="d_cu_seqlens", page_table="d_page_table")
    total = n_phases(s.layers, s.qk_norm)
    ranges = [(i, i + 1) for i in range(total)] if phases else [(0, total)]
    m["programs"]["decode"]["calls"] = [_call(s, "seqs", "d_next", "d_logits", 1, 1, 1, lo, hi, **decode_io)
                                        for lo, hi in ranges]
    m["programs"]["decode"]["graph"] = graph

    # generate: prompts packed (cu_seqlens), each from its position, new_tokens greedy tokens a
    # sequence, prompts taken MAX_CHUNK tokens a step. The in-kernel loop ends by itself (every
    # step consumes prompt tokens or makes one); max_steps is only a bound. No `batch`: the host
    # loop never steps it; kern.MegaModel finds it by its roles.
    context_max = m["vars"]["context"]["max"]
    m["vars"].update({"gen_seqs": {"max": MAX_SEQS}, "gen_rows": {"max": m["vars"]["tokens"]["max"]},
                      "new_tokens": {"max": context_max}})
    pages = {"ceil_div": ["context", "page_tokens"]}
    bufs.update({
        "g_ids": buffer(["gen_rows"], "input", "i32", fill="token", domain={"range": [0, "vocab"]}),
        "g_pos": buffer(["gen_rows"], "input", "i32", fill="position", domain={"range": [0, "context"]}),
        "g_cu_seqlens": buffer([{"add": ["gen_seqs", 1]}], "input", "i32", fill="cu_seqlens",
                             domain={"range": [0, {"add": ["gen_rows", 1]}]}),
        "g_page_table": buffer(["gen_seqs", pages], "input", "i32", domain={"index_into": "kv", "stride": "page_tokens"}),
        "g_tokens": buffer(["gen_seqs", "new_tokens"], "output", "i32", fill="tokens"),
        "g_logits": buffer(["gen_seqs", "vocab"], "output", "f32", fill="logits"),
    })
    m["programs"]["generate"] = {"calls": [_call(s, "gen_seqs", "g_tokens", "g_logits", MAX_CHUNK,
                                                 "new_tokens", 1 << 30, 0, total, ids="g_ids", pos="g_pos", cu="g_cu_seqlens",
                                                 page_table="g_page_table")]}

    m["ops"]["mega_step"] = {"params": list(PARAMS), "impl": {"launches": [{
        "module": "mega", "entry": "mega_decode", "grid": [sms], "block": [THREADS],
        "shared_mem": SMEM_BYTES,
        "cooperative": True,
        # bar and sem: zero between launches (the last block to leave resets bar, every merge its
        # counter in sem), so the launch leaves them as it found them and does not list them (kern test
        # would poison them: a hang, a merge that never happens)
        "writes": [p.split(":")[0] for p in PARAMS if ": out " in p or p.startswith("kv_state")]}]}}
    # what only the per-op decode read (its sampling inputs among them: the megakernel picks the
    # argmax; a host that samples reads the logits)
    passed = {a["buf"] for prog in m["programs"].values() for c in prog["calls"] for a in c["args"] if "buf" in a}
    listed = set(bufs["mega_weights"]["entries"])
    m["buffers"] = {n: b for n, b in bufs.items() if n in passed or n in listed}
    used_ops = {c["op"] for prog in m["programs"].values() for c in prog["calls"]}
    m["ops"] = {n: op for n, op in m["ops"].items() if n in used_ops}
    used_modules = {l.get("module") for op in m["ops"].values() for l in op["impl"]["launches"]}
    m["modules"] = {n: mod for n, mod in m["modules"].items() if n in used_modules}
    m["modules"]["mega"] = {"source": "kernels/mega.cubin", "sha256": ""}
    return m
