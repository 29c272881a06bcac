"""The long-context case Kimi-Linear exists for (issue 38, item 3): 8 streams of 32,768-token
prompts and one stream of a 131,072-token prompt, 64 tokens out each, over HTTP (bench/serve.py)
on one server: kern serve with no flags but the checkpoint, or vLLM 0.26 with its defaults but
--max-model-len (and --gpu-memory-utilization). Per case: TTFT, output tok/s (serve.py's: all
output tokens over the case's wall, prefill included) and the decode rate (streams / TPOT p50),
and the state memory a sequence holds, measured and computed:

  kern  measured: /metrics' pool gauges polled while the case runs, the most the running
        sequences lease at once (held less cached, less the idle baseline: pages x page bytes +
        slots x slot bytes, the unit sizes the manifest's) over the sequences running then; and
        after the case, what its finished sequences left cached, a sequence (their checkpoints;
        on CUDA with the snapshot at each prompt's end, docs/states.md). computed: the manifest's
        page and slot sizes for prompt + output tokens (the MLA pages and one KDA slot), beside
        the same before the generator pads them (the raw bytes).
  vLLM  measured: /metrics' vllm:kv_cache_usage_perc (blocks in use, of the pool) x the pool's
        bytes (its log's "Available KV cache memory") over vllm:num_requests_running at the
        peak; and vLLM's own figure for a --max-model-len sequence, that memory over its log's
        "Maximum concurrency for N tokens per request". computed: vLLM's KV cache spec from the
        config (vllm_memory below): MLA blocks of the hybrid block size its log names and a KDA
        state padded to one block in each of its KDA groups.

Both servers are given one context, POSITIONS: kern through the checkpoint's config (its
default context is the model's own, clipped to the deployment's bound), vLLM through
--max-model-len. The checkpoint: CKPT-long beside CKPT, its weights linked and config.json saying
POSITIONS, or, without CKPT's config.json, the seeded random 8-layer checkpoint made there.

    python3 bench/kimi_long.py CKPT --server kern|vllm [--out DIR] [--cases 8x32768,1x131072] [--serve-streams 32,128]
    python3 bench/kimi_long.py CKPT --server vllm --attach URL --server-log LOG   # a server already up
    python3 bench/kimi_long.py --table DIR   # long_kern.json and long_vllm.json side by side
    python3 bench/kimi_long.py --plan        # kern's default context and pool on an H200, on the CPU

Results: DIR/long_{server}.json, rewritten after each case, and `RESULT {json}` lines;
DIR/long_summary.{json,txt} from --table. bench/kimi_long_gpu.sh runs it on the device.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
from hybrid_serve import (  # the sibling scripts' helpers (run as a script: bench/ is its path)
    emit,
    up,
)
from hybrid_serve import pool as kern_gauges
from serve import prepare

CASES = "8x32768,1x131072"
OUTPUT = 64
# The longest sequence the cases reach (131,072 + 64) with room for what a chat template or a
# BOS adds; a multiple of kern's 16-token page. Both servers get this context.
POSITIONS = 131072 + 1024
SHAPE, LAYERS = "kimi-linear-48b-a3b", 8
H200 = 143771 << 20  # nvidia-smi's memory.total of an H200, bytes
WARM_PROMPT = 8192   # one untimed request first: the long prefill's first launches (JIT, graphs) on neither clock


def cases(text: str) -> list[tuple[int, int]]:
    """'8x32768,1x131072' -> [(8, 32768), (1, 131072)]: streams at once x prompt tokens."""
    out = []
    for part in text.split(","):
        n, _, length = part.strip().partition("x")
        if not (n.isdigit() and length.isdigit() and int(n) > 0 and int(length) > 0):
            raise ValueError(f"case {part!r}: STREAMSxPROMPT, e.g. 8x32768")
        out.append((int(n), int(length)))
    return out


# ---- the checkpoint ------------------------------------------------------------------------

def saying(dst: Path, positions: int) -> Path:
    """dst's config.json saying `positions` (transformers saves max_position_embeddings as
    model_max_length, which kern reads first: both are set), prepared for bench/serve.py."""
    cfg = json.loads((dst / "config.json").read_text())
    cfg["model_max_length"] = cfg["max_position_embeddings"] = positions
    (dst / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    prepare(dst)
    return dst


def long_checkpoint(src: Path, dst: Path, positions: int = POSITIONS) -> Path:
    """dst: src's weights linked (no copy of ~28 GB), its JSON files copied, saying `positions`.
    The weights are the same: Kimi-Linear's MLA rotates nothing, so its positions bound no tensor."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in sorted(src.iterdir()):
        target = dst / f.name
        if target.is_symlink() or target.exists():
            target.unlink()
        if f.suffix == ".json":  # copied: prepare() and this function write them, never src's
            target.write_bytes(f.read_bytes())
        else:
            target.symlink_to(f.resolve())
    return saying(dst, positions)


def make_checkpoint(dst: Path, *, shape: str = SHAPE, layers: int = LAYERS, device: str = "cuda",
                    positions: int = POSITIONS) -> Path:
    """The seeded random checkpoint as bench/kimi_gpu.py's ckpt step makes it (bf16 from the
    start, seed 0, sharpened: the same weights), saying `positions`, prepared for bench/serve.py."""
    import torch
    from kern_models.kimi_linear.random_checkpoint import model_of, save

    torch.set_default_dtype(torch.bfloat16)
    save(model_of(shape, layers=layers, device=device, max_positions=positions).eval(), dst)
    return saying(dst, positions)


# ---- the state memory a sequence holds: kern ------------------------------------------------

def kern_memory(manifest: Path) -> dict:
    """A deployment's state units: each paged state's bytes a token and a page, each
    per-sequence state's bytes a slot (as the pool declares them: runtime/paging.declarations)."""
    from kern.manifest import load_verified
    from kern.manifest.protocol import derive
    from kern.runtime.paging import declarations

    v = load_verified(manifest)
    (page_tokens,) = set(derive(v).paged_states.values())
    decls, chunk = declarations(v, page_tokens)
    return {"page_tokens": page_tokens, "chunk_bytes": chunk,
            "token_bytes": {d.name: d.size for d in decls if d.kind == "paged"},
            "slot_bytes": {d.name: d.size for d in decls if d.kind == "per_seq"}}


def kern_seq_bytes(mem: dict, tokens: int) -> int:
    """What a sequence of `tokens` positions holds: the pages its tokens fill in every paged
    state and a slot of every per-sequence state."""
    pages = -(-tokens // mem["page_tokens"])
    return (sum(pages * mem["page_tokens"] * b for b in mem["token_bytes"].values())
            + sum(mem["slot_bytes"].values()))


def raw_state(cfg: dict, elem: int = 2, kda_rows: int = 0) -> dict:
    """Kimi-Linear's state before the generator pads it (manifests/common.py state_constants):
    the MLA cache a token (every MLA layer's latent and key part, `elem` bytes each: bf16 on
    sm_90a) and the KDA state a sequence (every KDA layer's recurrence [heads, dim, dim] and its
    convolution windows [conv - 1, 3 x heads x dim], f32, and kda_rows rows of dim a head kept
    inside a chunk: sm_90a's default build's kda_tc, 3 x 16)."""
    from kern_models.kimi_linear.config import shape_of

    s = shape_of(cfg)
    return {"token_bytes": len(s.mla_layers) * (s.kv_lora + s.rope) * elem,
            "slot_bytes": len(s.kda_layers) * (s.kda_heads * s.kda_dim ** 2 + (s.conv - 1) * 3 * s.qkv
                                               + kda_rows * s.qkv) * 4}


def kda_rows(target: str) -> int:
    """The rows of dim a KDA head keeps inside a chunk in `target`'s default build (sm_90a's
    kda_tc: k, gc and v' of 16 rows; the cpu reference keeps none)."""
    from kern_models.kimi_linear.kernels.cuda import table

    return table.KDA_TC_ROWS * table.KDA_TC_C if target == "cuda" else 0


def kern_plan(manifest: Path, device_bytes: int = H200, overhead: int = 1 << 30, lengths=(32768 + OUTPUT,
              131072 + OUTPUT)) -> dict:
    """kern's defaults for a deployment on a device of `device_bytes`, worked out on the CPU as
    the engine works them out (runtime/engine.py, runtime/paging.py, generation/limits.py): the
    state budget (DEVICE_SHARE of the device less the weights and buffers, `overhead` for the
    CUDA context, and GRAPH_RESERVE), the pool planned under it at CUDA's 2 MiB mapping
    granularity, the default context and sequences at once, whether a lease of each of
    `lengths` tokens fits, and how many such sequences the budget holds at once."""
    from math import prod

    from kern.generation.limits import limits_for
    from kern.manifest import load_verified
    from kern.manifest.expr import evaluate
    from kern.manifest.protocol import derive
    from kern.manifest.schema import DTYPE_BYTES
    from kern.runtime.paging import DEVICE_SHARE, GRAPH_RESERVE, Paging, plan_pool

    v = load_verified(manifest)
    m, protocol = v.manifest, derive(v)
    env = {**v.constants, **{n: var.max for n, var in m.vars.items()}}
    size = {n: prod(evaluate(d, env) for d in b.shape) * DTYPE_BYTES[b.dtype] for n, b in m.buffers.items()}
    weights = sum(b for n, b in size.items() if m.buffers[n].kind == "weight")
    used = sum(size.values()) + overhead
    budget = int(DEVICE_SHARE * device_bytes) - used - GRAPH_RESERVE
    (page_tokens,) = set(protocol.paged_states.values())

    class Books:  # the pool's plans run on nothing: only its books are wanted
        def remap_state(self, *a, **kw): pass
        def copy_state(self, *a, **kw): pass

    paging = Paging(plan_pool(v, page_tokens, budget, granularity=2 << 20), Books())
    limits = limits_for(protocol, paging.fits, page_tokens, None, None, 8, scratch_tokens=page_tokens,
                        capacity=paging.capacity())
    lay = paging.pool.layout
    at_once = {}
    for n in lengths:  # every such sequence's pages and slot, whole chunks of each (remapped between them)
        def chunks(seqs, n=n):
            return sum(-(-(seqs * (-(-n // page_tokens) if k.paged else 1)) // k.per_chunk) for k in lay.kinds)
        lo, hi = 0, 1 << 20
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if chunks(mid) <= lay.dynamic - 1 else (lo, mid - 1)  # a chunk of each: the scratch
        at_once[n] = lo
    return {"device_bytes": device_bytes, "weights_bytes": weights, "buffers_bytes": sum(size.values()) - weights,
            "budget_bytes": budget, "chunk_bytes": lay.chunk_bytes, "chunks": lay.dynamic,
            "capacity_tokens": paging.capacity(), "deployment_context": m.vars["context"].max,
            "default_context": limits.context, "default_max_seqs": limits.max_seqs, "note": limits.note,
            "fits": {n: paging.fits(n) for n in lengths}, "sequences_at_once": at_once}


def real_config(layers: int = LAYERS, positions: int = POSITIONS, shape: str = SHAPE) -> dict:
    """The config.json fields kern reads of the random checkpoint at `layers` (no transformers:
    random_checkpoint.shape_config's arguments are names kern's config reader takes)."""
    from kern_models.kimi_linear.random_checkpoint import shape_config

    return {**shape_config(shape, layers), "max_position_embeddings": positions,
            "architectures": ["KimiLinearForCausalLM"]}


# ---- the state memory a sequence holds: vLLM -----------------------------------------------

def vllm_memory(cfg: dict, block: int | None = None, mamba_blocks: int = 1, align: int = 16) -> dict:
    """vLLM's KV cache spec for Kimi-Linear, from the config (vLLM 0.26: MLAAttentionSpec and
    KDA's MambaSpec, grouped as kv_cache_utils._get_kv_cache_groups_uniform_page_size groups
    them):
      - an MLA layer caches 576 bf16 channels a token (kv_lora + rope, one "kv head");
      - a KDA layer's state is its three convolution windows [(conv - 1), heads x dim] in the
        model's dtype and its recurrence [heads, dim, dim] in f32 (MambaStateShapeCalculator /
        MambaStateDtypeCalculator.kda_state_*);
      - the attention block grows to hold a KDA state in one page: `block` tokens (its log's
        "Setting attention block size to N tokens"; else `align` x ceil(state / (align x a token's
        bytes)), the rule that line comes from), the KDA page padded to it;
      - layers are grouped `group` a group (the fewest layers of a kind, or the most where they
        are within 1.5x); one block of a group is a page in each of `group` layers;
      - a sequence of L tokens holds ceil(L / block) blocks of each MLA group and `mamba_blocks`
        of each KDA group (1 without prefix caching's mamba "align" mode; more with it)."""
    from kern_models.kimi_linear.config import shape_of

    s = shape_of(cfg)
    token = (s.kv_lora + s.rope) * 2
    kda = 3 * s.qkv * (s.conv - 1) * 2 + s.kda_heads * s.kda_dim ** 2 * 4
    block = block or align * -(-kda // (align * token))
    n_mla, n_kda = len(s.mla_layers), len(s.kda_layers)
    few, most = min(n_mla, n_kda), max(n_mla, n_kda)
    group = most if most < few * 1.5 else few
    return {"block_tokens": block, "layer_page_bytes": block * token, "group_layers": group,
            "mla_groups": -(-n_mla // group), "kda_groups": -(-n_kda // group), "mamba_blocks": mamba_blocks,
            "block_bytes": block * token * group, "raw_token_bytes": n_mla * token, "raw_slot_bytes": n_kda * kda,
            "kda_layer_bytes": kda}


def vllm_seq_bytes(mem: dict, tokens: int) -> int:
    blocks = -(-tokens // mem["block_tokens"]) * mem["mla_groups"] + mem["mamba_blocks"] * mem["kda_groups"]
    return blocks * mem["block_bytes"]


def vllm_mamba_blocks(mem: dict, log: dict, positions: int) -> int:
    """The blocks a sequence holds of each KDA group, as vLLM's start-up lines imply them: its
    concurrency is its blocks over a --max-model-len (`positions`) request's, a whole number, and
    what of those are not MLA blocks are the KDA groups'. 1 (prefix caching's mamba "align" mode
    holds more) where the lines are missing or do not divide so."""
    if not (log.get("available_kv_gib") and log.get("max_concurrency")):
        return 1
    per_request = round(log["available_kv_gib"] * 2**30 / mem["block_bytes"] / log["max_concurrency"])
    mla = -(-positions // mem["block_tokens"]) * mem["mla_groups"]
    extra = per_request - mla
    return extra // mem["kda_groups"] if extra > 0 and extra % mem["kda_groups"] == 0 else 1


VLLM_LINES = {  # vLLM 0.26's start-up lines (gpu_worker.py, kv_cache_utils.py, the hybrid block size's)
    "available_kv_gib": r"Available KV cache memory: ([\d.]+) GiB",
    "kv_cache_tokens": r"GPU KV cache size: ([\d,]+) tokens",
    "max_concurrency": r"Maximum concurrency for [\d,]+ tokens per request: ([\d.]+)x",
    "max_concurrency_tokens": r"Maximum concurrency for ([\d,]+) tokens per request",
    "block_tokens": r"Setting attention block size to (\d+) tokens",
    "mamba_padding_pct": r"Padding mamba page size by ([\d.]+)%",
    "model_gib": r"Model loading took ([\d.]+) GiB",
}


def vllm_log(text: str) -> dict:
    """The figures of vLLM's start-up log (the last of each line: a restart's); a line it did
    not print is left out."""
    out = {}
    for key, rx in VLLM_LINES.items():
        found = re.findall(rx, text)
        if found:
            v = found[-1].replace(",", "")
            out[key] = float(v) if "." in v else int(v)
    if "available_kv_gib" in out and out.get("max_concurrency"):
        # vLLM's own figure: the cache over the --max-model-len sequences it says it holds at once
        out["bytes_a_max_len_seq"] = round(out["available_kv_gib"] * 2**30 / out["max_concurrency"])
    return out


def vllm_gauges(url: str) -> dict:
    """vLLM's /metrics: the KV cache's blocks in use (a fraction) and the requests running
    (summed over engines; the older name of the first tried too)."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()

    def total(*names):
        for name in names:
            found = re.findall(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", text, re.MULTILINE)
            if found:
                return sum(float(v) for v in found)
        return None

    return {"usage": total("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
            "running": total("vllm:num_requests_running")}


# ---- one server, the cases ------------------------------------------------------------------

class Poll:
    """`sample()` every `every` seconds while a case runs: the sample with the most bytes (64 decode
    steps last about a second on the H200: some 20 samples of the sequences at their longest)."""

    def __init__(self, sample, every: float = 0.05):
        self.sample, self.every, self.peak, self.stop = sample, every, None, threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                got = self.sample()
            except (OSError, ValueError):
                got = None
            if got and got["running"] and (self.peak is None or got["bytes"] > self.peak["bytes"]):
                self.peak = got
            self.stop.wait(self.every)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def serve_py(url: str, label: str, n: int, length: int, output: int, vocab: int, seed: int, timeout: float,
             warmup: int = 0) -> dict:
    """One bench/serve.py run: n requests of `length`-token prompts (nothing shared), all at
    once; its JSON line, or {"error"}. Its own --seed a case, so that no case's prompt starts
    with another's (a prefix cache would serve it)."""
    return run_serve(url, label, ["--prompt", str(length), "--shared", "0", "--output", str(output), "--requests",
                                  str(n), "--concurrency", str(n), "--warmup", str(warmup), "--vocab", str(vocab),
                                  "--seed", str(seed)], timeout)


def serve_workload(url: str, label: str, concurrency: int, vocab: int, timeout: float) -> dict:
    """bench/serve.py's default workload (docs/perf.md's serve rows) at one concurrency."""
    return {"concurrency": concurrency, **run_serve(url, label, ["--concurrency", str(concurrency), "--warmup", "4",
                                                                 "--vocab", str(vocab)], timeout)}


def run_serve(url: str, label: str, flags: list[str], timeout: float) -> dict:
    """bench/serve.py's last JSON line, or {"error"}."""
    cmd = [sys.executable, str(ROOT / "bench/serve.py"), "--url", url, "--label", label, *flags]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"serve.py timed out after {timeout:.0f} s"}
    rows = [json.loads(ln) for ln in p.stdout.splitlines() if ln.startswith("{")]
    return rows[-1] if rows else {"error": (p.stderr.strip().splitlines() or ["no output"])[-1][:300]}


def kern_sampler(url: str, mem: dict, base: dict):
    """A sample of kern's pool: the bytes running sequences lease beyond the idle baseline."""
    unit = {**{s: mem["page_tokens"] * b for s, b in mem["token_bytes"].items()}, **mem["slot_bytes"]}

    def units(m):
        return {k.split(",")[0]: v - m["kern_pool_units_cached"].get(k, 0) for k, v in m["kern_pool_units_held"].items()}

    def sample():
        m = kern_gauges(url)
        held = units(m)
        extra = {s: held.get(s, 0) - base.get(s, 0) for s in unit}
        return {"running": m["kern_running_sequences"] or 0, "units": extra,
                "bytes": sum(extra[s] * unit[s] for s in unit)}
    return sample, units


def measure(args, url: str, server: str, cfg: dict, result: dict, write) -> None:
    # Prompt words w3..w9999 (at most 6 characters and a space a token), for both servers: vLLM
    # refuses a text prompt of more characters than 7 a token of --max-model-len before it
    # tokenizes, and the vocabulary's longer words ("w163839 ") left 131,072 tokens 959,943
    # characters, over its 924,224 (2026-12-06, H100)
    vocab = min(cfg["vocab_size"], 10_000)
    if server == "kern":
        from kern.deployments import deployment_for

        target = args.target or "cuda"
        # the deployment kern serve generated for this checkpoint (the same key: a cache hit)
        mem = kern_memory(deployment_for(args.long_ckpt, target, step_tokens=args.step_tokens))
        raw = raw_state(cfg, elem=2 if target == "cuda" else 4, kda_rows=kda_rows(target))
        result["memory"] = {"kern": mem, "raw": raw}
        first = kern_gauges(url)
        _, units = kern_sampler(url, mem, {})
        base = units(first)  # the padding rows' scratch page and slot
        sample, _ = kern_sampler(url, mem, base)
    else:
        log = vllm_log(Path(args.server_log).read_text(errors="replace")) if args.server_log else {}
        mem = vllm_memory(cfg, block=log.get("block_tokens"))
        pool_bytes = log.get("available_kv_gib", 0) * 2**30
        mem = vllm_memory(cfg, block=log.get("block_tokens"), mamba_blocks=vllm_mamba_blocks(mem, log, args.positions))
        result["memory"] = {"vllm": mem, "log": log}

        def sample():
            g = vllm_gauges(url)
            return {"running": g["running"] or 0, "usage": g["usage"], "bytes": (g["usage"] or 0) * pool_bytes}
    if args.warm_prompt:
        result["warm"] = serve_py(url, server, 1, args.warm_prompt, 4, vocab, 99, args.case_s, warmup=2)
        write()
    if server == "kern":  # what is cached before the cases (the warm-up's checkpoints among it)
        cached0 = {k.split(",")[0]: v for k, v in kern_gauges(url)["kern_pool_units_cached"].items()}
    for i, (n, length) in enumerate(cases(args.cases)):
        with Poll(sample) as poll:
            row = serve_py(url, server, n, length, args.output, vocab, i + 1, args.case_s)
        case = {"server": server, "case": f"{n}x{length}", "streams": n, "prompt": length, "output": args.output, "serve": row}
        tpot = (row.get("tpot_ms") or {}).get("p50")
        case["decode_tok_s"] = round(n * 1e3 / tpot, 1) if tpot else None
        peak = poll.peak
        state = {"peak": peak, "measured_bytes_a_seq": round(peak["bytes"] / peak["running"]) if peak else None}
        if server == "kern":
            state["computed_bytes_a_seq"] = kern_seq_bytes(mem, length + args.output)
            state["raw_bytes_a_seq"] = (length + args.output) * raw["token_bytes"] + raw["slot_bytes"]
            # what the finished sequences left cached, a sequence (their checkpoints' pages and slots)
            time.sleep(0.5)
            after = kern_gauges(url)
            cached = {k.split(",")[0]: v for k, v in after["kern_pool_units_cached"].items()}
            grown = {s: cached.get(s, 0) - cached0.get(s, 0) for s in cached}
            cached0 = cached
            unit = {**{s: mem["page_tokens"] * b for s, b in mem["token_bytes"].items()}, **mem["slot_bytes"]}
            state["cached_after"] = {"units": grown, "bytes_a_seq": round(sum(grown[s] * unit[s] for s in grown) / n)}
        else:
            state["computed_bytes_a_seq"] = vllm_seq_bytes(mem, length + args.output)
            state["raw_bytes_a_seq"] = (length + args.output) * mem["raw_token_bytes"] + mem["raw_slot_bytes"]
            state["pool_bytes"] = pool_bytes or None
        case["state"] = state
        result["cases"].append(case)
        emit(long=case)
        write()
    # the serve workload on the same server (one start-up each, vLLM's ~290 s): 512-token
    # prompts sharing 256, 128 out, 256 requests at each concurrency, as bench/serve.py's defaults
    for c in [int(x) for x in args.serve_streams.split(",") if x]:
        row = serve_workload(url, server, c, vocab, args.case_s)
        result.setdefault("serve", []).append(row)
        emit(serve=row)
        write()



def start(args, server: str) -> tuple[subprocess.Popen, float]:
    """The server, in a session of its own (vLLM's engine processes go with it when it stops)."""
    if server == "kern":
        cmd = [sys.executable, "-m", "kern.cli", "serve", str(args.long_ckpt), "--port", str(args.port),
               *(["--target", args.target] if args.target else []),
               *(["--step-tokens", str(args.step_tokens)] if args.step_tokens else [])]
        env, cwd = os.environ, None
    else:
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(args.long_ckpt),
               "--port", str(args.port), "--max-model-len", str(args.positions),
               "--gpu-memory-utilization", str(args.vllm_util)]
        # vLLM's wheels over the image's site-packages, as bench/moe_serve_gpu.sh starts it: neither
        # kern's carried wheels nor kern (whose vLLM plugin would then load) on its path; from /tmp,
        # as a server whose working directory goes dies at its first Path.resolve
        # expandable segments: on an 80 GB card vLLM's MLA profiling otherwise asks for one 29.5 GiB
        # block and fails (2026-12-06, H100, docs/perf-history.md)
        env, cwd = {**os.environ, "PYTHONPATH": args.vllm_site, "HF_HUB_OFFLINE": "1",
                    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, "/tmp"
    log = Path(args.server_log)
    with log.open("w") as f:
        return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                start_new_session=True), time.monotonic()


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the server's own session (its engine processes too), then SIGKILL."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def run_server(args) -> int:
    server = args.server
    if args.step_tokens and server != "kern":
        raise SystemExit("--step-tokens is kern serve's (vLLM's chunk is its own --max-num-batched-tokens)")
    label = server + (f"-s{args.step_tokens}" if args.step_tokens else "")  # kern at another step size beside
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    args.server_log = args.server_log or str(out / f"long_{label}_serve.log")
    result: dict = {"server": server, "label": label, "step_tokens": args.step_tokens, "positions": args.positions,
                    "cases": [], "notes": []}
    path = out / f"long_{label}.json"

    def write():
        path.write_text(json.dumps(result, indent=1) + "\n")

    if args.deadline_s:  # a caller's timeout kills this process only: stop the server first
        def late(*_):
            raise TimeoutError(f"past the {args.deadline_s} s deadline")
        signal.signal(signal.SIGALRM, late)
        signal.alarm(args.deadline_s)
    ckpt = Path(args.ckpt)
    args.long_ckpt = Path(args.long_ckpt) if args.long_ckpt else ckpt.parent / f"{ckpt.name}-long"
    if not (args.long_ckpt / "config.json").is_file():
        t0 = time.monotonic()
        if (ckpt / "config.json").is_file():
            long_checkpoint(ckpt, args.long_ckpt, args.positions)
        else:  # in a process of its own: the model's GPU memory goes back before the server starts
            subprocess.run([sys.executable, __file__, "--make", str(args.long_ckpt), "--shape", args.shape, "--layers",
                            str(args.layers), "--device", args.device, "--positions", str(args.positions)], check=True)
        result["checkpoint_s"] = round(time.monotonic() - t0, 1)
    result["checkpoint"] = str(args.long_ckpt)
    cfg = json.loads((args.long_ckpt / "config.json").read_text())
    proc = None
    try:
        if args.attach:
            url = args.attach
            result["startup_s"] = args.startup_s
        else:
            if args.port == 0:  # a free port, as the system picks one (two runs side by side, a test's)
                import socket

                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", 0))
                    args.port = sock.getsockname()[1]
            url = f"http://127.0.0.1:{args.port}"
            proc, t0 = start(args, server)
            if not up(url, proc, args.up_s):
                tail = Path(args.server_log).read_text(errors="replace").replace("\r", "\n").strip().splitlines()[-8:]
                result["notes"].append(f"{server} did not come up in {args.up_s} s: " + " | ".join(tail))
                write()
                print(result["notes"][-1], flush=True)
                return 1
            result["startup_s"] = round(time.monotonic() - t0, 1)
        emit(**{f"long_{server}_startup_s": result["startup_s"]})
        write()
        measure(args, url, server, cfg, result, write)
    except TimeoutError as e:
        result["notes"].append(str(e))
        write()
    finally:
        if proc is not None:
            stop(proc)
    print(f"LONG OK ({server})", flush=True)
    return 0


# ---- the table -----------------------------------------------------------------------------

def table(results: dict) -> tuple[dict, str]:
    """Each case on each server side by side (TTFT p50, output tok/s, decode tok/s, the bytes a
    sequence holds: measured, computed, raw) with kern against vLLM (speed: kern / vLLM, so
    above 1 is kern ahead; TTFT and memory: vLLM / kern, likewise)."""
    mib = lambda b: f"{b / 2**20:,.2f} MiB" if b else "-"
    rows, lines = [], []
    for name, r in results.items():
        lines.append(f"{name}: up in {r.get('startup_s')} s, context {r.get('positions'):,}"
                     + (f"; notes: {' | '.join(r['notes'])}" if r.get("notes") else ""))
    names = list(dict.fromkeys(c["case"] for r in results.values() for c in r["cases"]))  # as run
    lines.append(f"{'case':12s} {'server':12s} {'done':>6s} {'TTFT p50':>11s} {'out tok/s':>10s} {'decode':>9s} "
                 f"{'measured/seq':>14s} {'computed/seq':>14s} {'raw/seq':>12s}")
    for case in names:
        got = {}
        for name, r in results.items():
            c = next((c for c in r["cases"] if c["case"] == case), None)
            if c is None:
                continue
            s, st = c["serve"], c["state"]
            got[name] = row = {"case": case, "server": name, "completed": s.get("completed"),
                               "requests": s.get("requests"), "error": s.get("error"),
                               "ttft_p50_ms": (s.get("ttft_ms") or {}).get("p50"),
                               "output_tok_s": s.get("output_throughput"), "decode_tok_s": c.get("decode_tok_s"),
                               "measured_bytes_a_seq": st.get("measured_bytes_a_seq"),
                               "computed_bytes_a_seq": st.get("computed_bytes_a_seq"),
                               "raw_bytes_a_seq": st.get("raw_bytes_a_seq")}
            rows.append(row)
            ttft = f"{row['ttft_p50_ms'] / 1e3:,.2f} s" if row["ttft_p50_ms"] else "-"
            lines.append(f"{case:12s} {name:12s} {row['completed'] or 0:>3}/{row['requests'] or '?':<2} {ttft:>11s} "
                         f"{row['output_tok_s'] or '-':>10} {row['decode_tok_s'] or '-':>9} "
                         f"{mib(row['measured_bytes_a_seq']):>14s} {mib(row['computed_bytes_a_seq']):>14s} "
                         f"{mib(row['raw_bytes_a_seq']):>12s}" + (f"  {row['error']}" if row["error"] else ""))
        def ratio(a, b):
            return round(a / b, 3) if a and b else None
        v = got.get("vllm")
        for kname, k in got.items():  # kern at each step size against vLLM
            if kname == "vllm" or not v:
                continue
            vs = {"case": case, "server": f"{kname}/vllm", "output_tok_s": ratio(k["output_tok_s"], v["output_tok_s"]),
                  "decode_tok_s": ratio(k["decode_tok_s"], v["decode_tok_s"]),
                  "ttft_vllm_over_kern": ratio(v["ttft_p50_ms"], k["ttft_p50_ms"]),
                  "bytes_vllm_over_kern": ratio(v["measured_bytes_a_seq"], k["measured_bytes_a_seq"])}
            rows.append(vs)
            lines.append(f"{case:12s} {kname} vs vLLM: output tok/s {vs['output_tok_s']}x, decode {vs['decode_tok_s']}x, "
                         f"TTFT {vs['ttft_vllm_over_kern']}x (vLLM's over kern's), state a sequence "
                         f"{vs['bytes_vllm_over_kern']}x (vLLM's over kern's; above 1: kern holds less)")
    serve = serve_table(results, lines)
    return {"rows": rows, "serve": serve, "servers": {n: {k: r.get(k) for k in ("startup_s", "positions", "notes", "memory")}
                                                      for n, r in results.items()}}, "\n".join(lines)


def serve_table(results: dict, lines: list[str]) -> list[dict]:
    """The serve workload's rows (--serve-streams): output tok/s, TTFT and TPOT p50 a server, and
    each kern's output tok/s over vLLM's at the same concurrency."""
    rows = []
    for name, r in results.items():
        for x in r.get("serve", []):
            rows.append({"server": name, "concurrency": x.get("concurrency"), "error": x.get("error"),
                         "output_tok_s": x.get("output_throughput"), "ttft_p50_ms": (x.get("ttft_ms") or {}).get("p50"),
                         "tpot_p50_ms": (x.get("tpot_ms") or {}).get("p50")})
    if rows:
        lines.append(f"{'serve':12s} {'server':12s} {'streams':>7s} {'out tok/s':>10s} {'TTFT p50':>10s} {'TPOT p50':>9s}")
    for x in rows:
        lines.append(f"{'':12s} {x['server']:12s} {x['concurrency'] or '?':>7} {x['output_tok_s'] or '-':>10} "
                     f"{x['ttft_p50_ms'] or '-':>10} {x['tpot_p50_ms'] or '-':>9}" + (f"  {x['error']}" if x["error"] else ""))
    vllm = {x["concurrency"]: x for x in rows if x["server"] == "vllm"}
    for x in [x for x in rows if x["server"] != "vllm"]:
        v = vllm.get(x["concurrency"])
        if v and x["output_tok_s"] and v["output_tok_s"]:
            ratio = round(x["output_tok_s"] / v["output_tok_s"], 3)
            x["over_vllm"] = ratio
            lines.append(f"{'serve':12s} {x['server']} vs vLLM at {x['concurrency']} streams: output tok/s {ratio}x")
    return rows


def write_table(folder: Path) -> str:
    files = sorted(folder.glob("long_*.json"), key=lambda f: (f.stem == "long_vllm", f.stem))  # kern's, vLLM's last
    results = {f.stem[len("long_"):]: r for f in files if "server" in (r := json.loads(f.read_text()))}  # not the
    # summary's or kern bench's JSON beside them
    summary, text = table(results)
    (folder / "long_summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (folder / "long_summary.txt").write_text(text + "\n")
    return text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ckpt", nargs="?", type=Path, help="the bench's checkpoint (its -long sibling is served)")
    ap.add_argument("--server", choices=("kern", "vllm"), default="kern")
    ap.add_argument("--out", default=os.environ.get("OUT", "."), help="where long_{server}.json goes")
    ap.add_argument("--cases", default=CASES, help="streams at once x prompt tokens, comma-separated")
    ap.add_argument("--output", type=int, default=OUTPUT, help="tokens out a request")
    ap.add_argument("--positions", type=int, default=POSITIONS, help="the context both servers are given")
    ap.add_argument("--long-ckpt", default=None, help="the served checkpoint (default: CKPT-long beside CKPT)")
    ap.add_argument("--shape", default=SHAPE)
    ap.add_argument("--layers", type=int, default=LAYERS)
    ap.add_argument("--device", default="cuda", help="where a checkpoint made here is made")
    ap.add_argument("--target", default=None, help="kern serve's --target, only when given (a dry run: cpu)")
    ap.add_argument("--port", type=int, default=8120, help="the server's (0: a free one)")
    ap.add_argument("--warm-prompt", type=int, default=WARM_PROMPT, help="an untimed request first (0: none)")
    ap.add_argument("--up-s", type=float, default=420, help="the server's start-up, at most")
    ap.add_argument("--case-s", type=float, default=420, help="each case's serve.py run, at most (a 131k prefill)")
    ap.add_argument("--deadline-s", type=int, default=0, help="stop everything (the server too) after this long")
    ap.add_argument("--serve-streams", default="", metavar="C,C",
                    help="after the long cases, the serve workload (bench/serve.py's defaults) at these "
                         "concurrencies on the same server, e.g. 32,128 (default: none)")
    ap.add_argument("--step-tokens", type=int, default=None,
                    help="kern serve --step-tokens (its results then long_kern-sN.json, beside the default's)")
    ap.add_argument("--vllm-util", type=float, default=0.9, help="vLLM's --gpu-memory-utilization")
    ap.add_argument("--vllm-site", default="/tmp/vsite", help="vLLM's PYTHONPATH (its wheels)")
    ap.add_argument("--attach", default=None, metavar="URL", help="measure a server already up (not stopped)")
    ap.add_argument("--server-log", default=None, help="the server's log (vLLM's is parsed for its KV cache)")
    ap.add_argument("--startup-s", type=float, default=None, help="with --attach: its start-up, as measured")
    ap.add_argument("--table", type=Path, default=None, metavar="DIR", help="only write DIR's summary")
    ap.add_argument("--make", type=Path, default=None, metavar="DIR", help="only make the checkpoint in DIR")
    ap.add_argument("--plan", action="store_true", help="only print kern's default context and pool on an H200")
    args = ap.parse_args()
    if args.table:
        print(write_table(args.table))
        return 0
    if args.make:
        make_checkpoint(args.make, shape=args.shape, layers=args.layers, device=args.device, positions=args.positions)
        return 0
    if args.plan:
        import tempfile

        from kern_models.kimi_linear.generator import generate

        with tempfile.TemporaryDirectory() as tmp:
            man = generate(real_config(args.layers, args.positions, args.shape), Path(tmp) / "dep", target="cuda",
                           model="kimi-long")
            print(json.dumps({"memory": kern_memory(man), "plan": kern_plan(man)}, indent=1))
        return 0
    if args.ckpt is None:
        ap.error("CKPT is needed (or --table DIR, or --plan)")
    return run_server(args)


if __name__ == "__main__":
    # a caller's `timeout` (SIGTERM) unwinds like an error, so the server this started is stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(main())
