"""Decode on the GPU: kern (graph replay) vs transformers eager, side by side, same run.

    python bench/decode.py [--shapes smollm2-135m,qwen3-0.6b,llama-3.2-1b] [--batch 1,16]

Random-weight checkpoints (seeded) in Hugging Face layout, greedy, 128 new tokens after a
32-token prompt. Also checks kern's teacher-forced argmax against transformers eager bf16, and
graph replay against launching the same list one by one (bitwise). Prints one JSON object."""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path


import numpy as np

from kern_models.common.random_checkpoint import SHAPES, make

from kern.drive.raw_pages import raw


def cache_kw(ref) -> str:
    """transformers' name for the KV-cache argument: `cache` from 5.24 (where `past_key_values`
    warns; it goes in 5.40), `past_key_values` before (the device image has 5.17)."""
    import inspect

    return "cache" if "cache" in inspect.signature(ref.forward).parameters else "past_key_values"


def cache_of(out):
    """The KV cache a forward returned, under either release's name."""
    return out.cache if getattr(out, "cache", None) is not None else out.past_key_values


def checkpoint(name: str, folder: Path) -> Path:
    return make(name, folder, device="cuda")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--batch", default="1,16")
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--compiled", action="store_true",
                    help="also time transformers with a static cache and torch.compile (reduce-overhead)")
    ap.add_argument("--prefill", type=int, default=2040, help="prefill length timed once per shape (0: skip)")
    ap.add_argument("--decode-split", type=int, default=None,
                    help="context tokens per decode attention block (default: the generator's)")
    ap.add_argument("--context", type=int, default=4096,
                    help="the manifest's context bound (4096: that of the figures in docs/perf.md)")
    ap.add_argument("--no-reach", action="store_true",
                    help="leave the decode reach var at its bound (attention launches the bound's splits)")
    ap.add_argument("--run-ahead", type=int, default=1,
                    help="decode steps a host sync: Engine.run_steps, the token fed back on the device")
    args = ap.parse_args()

    import torch
    import transformers

    from kern.api import Model
    from kern_models.llama.generator import generate

    results = {"gpu": torch.cuda.get_device_name(0), "new_tokens": args.new, "prompt_tokens": args.prompt, "runs": []}
    for name in args.shapes.split(","):
        tmp = Path(tempfile.mkdtemp())
        ckpt = checkpoint(name, tmp / "ckpt")
        cfg = json.loads((ckpt / "config.json").read_text())
        split = {"decode_split": args.decode_split} if args.decode_split else {}
        man = generate(cfg, tmp / "deploy", target="cuda", model=name, context=args.context, **split)
        t0 = time.perf_counter()
        model = Model(man, ckpt, state_budget=4 << 30)
        load_s = time.perf_counter() - t0
        ref = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.bfloat16,
                                                                attn_implementation="eager").cuda().eval()
        rng = np.random.default_rng(0)
        vocab = cfg["vocab_size"]
        weight_bytes = sum(int(np.prod(model.engine.shapes[n])) * 2 for n, b in model.engine.m.buffers.items()
                           if b.kind == "weight" and n != "embed")
        if args.prefill:
            results["runs"].append({"shape": name, **prefill(model, ref, rng.integers(0, vocab, args.prefill))})
            print(json.dumps(results["runs"][-1]), flush=True)
        for batch in [int(b) for b in args.batch.split(",")]:
            prompts = rng.integers(0, vocab, (batch, args.prompt)).astype(np.int32)
            r = run_kern(model, prompts, args.new, args.run_ahead, reach=not args.no_reach)
            h = run_hf(ref, prompts, args.new)
            agree = float(np.mean(np.array(r["tokens"])[:, :16] == np.array(h["tokens"])[:, :16]))
            c = None
            if args.compiled:
                try:
                    c = run_compiled(ref, prompts, args.new)
                except Exception as e:  # noqa: BLE001 - a peer that fails to compile is reported, the run goes on
                    c = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            results["runs"].append({
                **({"hf_compiled_decode_tok_s": round(c["tok_s"], 1), "hf_compiled_step_ms": round(c["step_ms"], 3),
                    "ratio_kern_over_hf_compiled": round(r["tok_s"] / c["tok_s"], 2)} if c and "error" not in c
                   else {"hf_compiled_error": c["error"]} if c else {}),
                "weight_bytes_per_step": weight_bytes,
                "kern_bandwidth_tb_s": round(weight_bytes / (r["step_ms"] * 1e-3) / 1e12, 2),
                "kern_fraction_of_4_2_tb_s": round(weight_bytes / (r["step_ms"] * 1e-3) / 4.2e12, 3),
                "shape": name, "batch": batch, "kern_load_s": round(load_s, 2), "kern_run_ahead": args.run_ahead,
                "kern_reach": not args.no_reach,
                "kern_decode_tok_s": round(r["tok_s"], 1), "kern_step_ms": round(r["step_ms"], 3),
                "kern_prefill_ms": round(r["prefill_ms"], 2),
                "hf_eager_decode_tok_s": round(h["tok_s"], 1), "hf_eager_step_ms": round(h["step_ms"], 3),
                "ratio_kern_over_hf_eager": round(r["tok_s"] / h["tok_s"], 2),
                "launches_per_step": len(model.engine.launches[model.protocol.for_rows(batch, 1).program]),
                "greedy_first16_agreement_with_hf": agree,
            })
            print(json.dumps(results["runs"][-1]), flush=True)
        del model, ref
        torch.cuda.empty_cache()
    print(json.dumps(results, indent=1))


def run_kern(model, prompts: np.ndarray, new: int, ahead: int = 1, reach: bool = True) -> dict:
    """Prefill each sequence, then decode all together: one graph replay per step, or with
    ahead > 1 one per `ahead` steps (Engine.run_steps feeds each step's tokens to the next on
    the device; the host waits once per chunk)."""
    eng, proto = model.engine, model.protocol
    batch, plen = prompts.shape
    pages = [raw(model).take(-(-(plen + new) // model.page_tokens)) for _ in range(batch)]
    t0 = time.perf_counter()
    nxt = [raw(model).step_rows(p.tolist(), 0, pg, ragged=True)[0] for p, pg in zip(prompts, pages)]
    prefill_ms = (time.perf_counter() - t0) * 1e3 / batch
    st = proto.for_rows(batch, 1)
    (table,) = st.page_tables
    pt = np.zeros(eng.shapes[table.buffer], np.int32)[:batch]
    for i, pg in enumerate(pages):
        pt[i, :len(pg)] = pg
    toks = [[t] for t in nxt]
    extra = {st.inputs["cu_seqlens"]: np.arange(batch + 1, dtype=np.int32)} if "cu_seqlens" in st.inputs else {}
    tok_in, pos_in, tok_out = st.inputs["token"], st.inputs["position"], st.outputs["tokens"]

    def step(k, n):
        """Steps k .. k + n - 1 (positions plen + k ..)."""
        inputs = {tok_in: np.array([t[-1] for t in toks], np.int32),
                  pos_in: np.full(batch, plen + k, np.int32), table.buffer: pt, **extra}
        vars = st.vars_for(batch, batch, reach=plen + k + n if reach else None)
        if n == 1:
            outs = [{tok_out: eng.read(tok_out, eng.run(st.program, vars, inputs))}]
        else:
            outs = eng.run_steps(st.program, vars, inputs,
                                 [{pos_in: np.full(batch, plen + k + j, np.int32)} for j in range(1, n)],
                                 feedback={tok_out: tok_in}, collect=[])
        for o in outs:
            for t, n_ in zip(toks, o[tok_out]):
                t.append(int(n_))

    steps = (new - 1 - ahead) // ahead * ahead
    # an untimed pass first: it captures the graph of every reach bucket the timed pass meets
    # (then the same steps again, from the same state: the same tokens)
    for k in range(0, ahead + steps, ahead):
        step(k, ahead)
    toks = [[t] for t in nxt]
    step(0, ahead)
    t0 = time.perf_counter()
    for k in range(ahead, ahead + steps, ahead):
        step(k, ahead)
    dt = time.perf_counter() - t0
    for pg in pages:
        raw(model).give(pg)
    return {"tok_s": batch * steps / dt, "step_ms": dt / steps * 1e3, "prefill_ms": prefill_ms, "tokens": toks}


def prefill(model, ref, ids) -> dict:
    """One prefill of len(ids) tokens: kern (one ragged program call) vs one transformers sdpa forward."""
    import torch

    pages = raw(model).take(-(-len(ids) // model.page_tokens))
    ids = [int(i) for i in ids]
    times = []
    for _ in range(4):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        raw(model).step_rows(ids, 0, pages, ragged=True)
        times.append(time.perf_counter() - t0)
    raw(model).give(pages)
    x = torch.tensor([ids], device="cuda")
    ref.config._attn_implementation = "sdpa"
    hf_times = []
    with torch.no_grad():
        for _ in range(4):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            ref(x, use_cache=False)
            torch.cuda.synchronize()
            hf_times.append(time.perf_counter() - t0)
    ref.config._attn_implementation = "eager"
    return {"prefill_tokens": len(ids), "kern_prefill_ms": round(min(times[1:]) * 1e3, 2),
            "hf_sdpa_forward_ms": round(min(hf_times[1:]) * 1e3, 2)}


def run_compiled(ref, prompts: np.ndarray, new: int, device: str = "cuda", mode: str | None = "reduce-overhead") -> dict:
    """A hand-written greedy loop over a static cache, the step compiled (reduce-overhead = CUDA graphs).
    Returns the greedy tokens too (tests/benchmarks/test_decode_peers.py runs it on the CPU, mode None)."""
    import torch
    from transformers import StaticCache

    batch, plen = prompts.shape
    cache = StaticCache(config=ref.config, max_cache_len=plen + new + 8)
    kw = cache_kw(ref)
    x = torch.tensor(prompts.astype(np.int64), device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def step(tok, pos, cache):
        return ref(tok, **{kw: cache}, cache_position=pos, use_cache=True).logits[:, -1:].argmax(-1)

    if mode:
        torch._dynamo.reset()  # a fresh compile for each model and batch, no guard pile-up
    fn = torch.compile(step, mode=mode, fullgraph=False) if mode else step

    def call(tok, pos: int):
        """One step; its token copied out of the graph's output buffer, which the next replay
        overwrites (CUDA graph trees are told a new step begins)."""
        if mode:
            torch.compiler.cudagraph_mark_step_begin()
        return fn(tok, torch.tensor([pos], device=device), cache).clone()
    with torch.no_grad():
        tok = ref(x, **{kw: cache}, cache_position=torch.arange(plen, device=device),
                  use_cache=True).logits[:, -1:].argmax(-1)
        toks = [tok]
        for k in range(3):  # compile and warm up the graphs
            tok = call(tok, plen + k)
            toks.append(tok)
        sync()
        t0 = time.perf_counter()
        steps = new - 5
        for k in range(steps):
            tok = call(tok, plen + 3 + k)
            toks.append(tok)
        sync()
        dt = time.perf_counter() - t0
    return {"tok_s": batch * steps / dt, "step_ms": dt / steps * 1e3,
            "tokens": torch.cat(toks, 1).cpu().numpy().tolist()}


def run_hf(ref, prompts: np.ndarray, new: int, device: str = "cuda") -> dict:
    import torch

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    x = torch.tensor(prompts.astype(np.int64), device=device)
    kw = cache_kw(ref)
    with torch.no_grad():
        out = ref(x, use_cache=True)
        cache, tok = cache_of(out), out.logits[:, -1:].argmax(-1)
        toks = [tok]
        sync()
        t0 = time.perf_counter()
        for _ in range(new - 2):
            out = ref(tok, **{kw: cache}, use_cache=True)
            cache, tok = cache_of(out), out.logits[:, -1:].argmax(-1)
            toks.append(tok)
        sync()
        dt = time.perf_counter() - t0
    steps = new - 2
    return {"tok_s": prompts.shape[0] * steps / dt, "step_ms": dt / steps * 1e3,
            "tokens": torch.cat(toks, 1).cpu().numpy().tolist()}


if __name__ == "__main__":
    main()
