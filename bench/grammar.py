"""Token-mask cost of a JSON schema: llguidance (what kern uses) beside xgrammar, on the embedded
model's tokenizer (SmolLM2, 49,152 tokens), then the cost inside kern's loop.

    pip install xgrammar   # not a kern dependency: it needs torch and transformers (docs/serve.md)
    python bench/grammar.py [--rows 16] [--repeats 5]
    python bench/grammar.py --no-libraries --target cuda --rows 8     # the loop on the H200

Each library walks the same document token by token: the time to build its view of the
vocabulary, to compile the schema, and to fill one row's mask a token (the first token, whose
mask is the widest, apart). --rows: masks for that many rows at once (llguidance's batched call,
as a step computes them). The mask's application on the cpu: the sample op masked and unmasked,
beside the host path it replaced. Then kern's loop decodes the embedded model (--target: cpu, or
cuda where the device applies the mask) with and without the schema (greedy, the same tokens):
the difference a step is what constrained rows cost, llguidance's share timed inside it."""

from __future__ import annotations

import argparse
import json
import platform
import time

import numpy as np

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}},
    "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                "required": ["city"]}}, "required": ["name", "age", "tags", "address"]}
DOC = {"name": "Ada Lovelace", "age": 36, "tags": ["a", "c", "b"], "address": {"city": "London", "zip": "W1"}}


def _stats(times: list[float]) -> dict:
    later = times[1:]
    return {"first_us": round(times[0] * 1e6), "mean_us": round(float(np.mean(later)) * 1e6),
            "p50_us": round(float(np.median(later)) * 1e6), "max_us": round(float(np.max(later)) * 1e6)}


def llguidance_cost(tk, ids: list[int], eos: int, rows: int) -> dict:
    import llguidance

    from kern.generation.constraints import JSON_OPTIONS

    t0 = time.perf_counter()
    lt = llguidance.LLTokenizer(tk.to_str(), n_vocab=tk.get_vocab_size(True), eos_token=eos)
    ex = llguidance.LLExecutor()
    t1 = time.perf_counter()
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(SCHEMA), overrides=JSON_OPTIONS)
    ms = [llguidance.LLMatcher(lt, grammar) for _ in range(rows)]
    t2 = time.perf_counter()
    words = (tk.get_vocab_size(True) + 31) // 32
    mask = np.zeros((rows, words), np.int32)
    times = []
    for t in ids:
        a = time.perf_counter()
        ex.unsafe_compute_mask_ptr([(m, i) for i, m in enumerate(ms)], mask.ctypes.data, words * 4, rows)
        times.append(time.perf_counter() - a)
        if not (mask[0, t // 32] >> (t % 32)) & 1:
            raise SystemExit(f"llguidance refused token {t} of the document")
        for m in ms:
            m.consume_token(t)
    return {"vocab_ms": round((t1 - t0) * 1e3), "compile_ms": round((t2 - t1) * 1e3, 1), **_stats(times)}


def xgrammar_cost(tk, ids: list[int], eos: int, rows: int) -> dict:
    try:
        import xgrammar as xgr
    except ImportError:
        return {"skipped": "xgrammar is not installed"}
    t0 = time.perf_counter()
    vocab = tk.get_vocab_size(True)
    info = xgr.TokenizerInfo([tk.id_to_token(i) for i in range(vocab)], vocab_type=xgr.VocabType.BYTE_LEVEL,
                             vocab_size=vocab, stop_token_ids=[eos])
    t1 = time.perf_counter()
    compiled = xgr.GrammarCompiler(info).compile_json_schema(json.dumps(SCHEMA), any_whitespace=False,
                                                             separators=(", ", ": "))
    ms = [xgr.GrammarMatcher(compiled) for _ in range(rows)]
    t2 = time.perf_counter()
    mask = xgr.allocate_token_bitmask(rows, vocab)
    times = []
    for t in ids:
        a = time.perf_counter()
        for i, m in enumerate(ms):
            m.fill_next_token_bitmask(mask, i)
        times.append(time.perf_counter() - a)
        for m in ms:
            if not m.accept_token(t):
                raise SystemExit(f"xgrammar refused token {t} of the document")
    return {"vocab_ms": round((t1 - t0) * 1e3), "compile_ms": round((t2 - t1) * 1e3, 1), **_stats(times)}


def apply_cost(vocab: int, rows: int, repeats: int) -> dict:
    """The mask's application on the cpu, a row: the sample op (the cpu deployment's, the
    reference of cuda/argmax.cu) unmasked and masked, beside the host path it replaced (the
    bitmask unpacked, sampling.mask, the argmax); and the bytes a masked row uploads."""
    from kern.generation.constraints import unpack
    from kern.generation.sampling import mask
    from kern_models.llama.kernels.cpu.kernels import sample

    rng = np.random.default_rng(0)
    z = rng.standard_normal((rows, vocab)).astype(np.float32)
    words = (vocab + 31) // 32
    bits = np.where(rng.random((rows, words)) < 0.5, -1, 0x5555).astype(np.int32)  # a grammar's density
    temps, keys, out = np.zeros(rows, np.float32), np.zeros((rows, 2), np.int32), np.empty(rows, np.int32)
    free, every = np.zeros(rows, np.int32), np.arange(1, rows + 1, dtype=np.int32)

    def host() -> None:
        zz = z.astype(np.float64)
        mask(zz, unpack(bits, vocab))
        np.argmax(zz, axis=1)

    def timed(f) -> float:
        ts = []
        for _ in range(repeats + 1):
            a = time.perf_counter()
            f()
            ts.append(time.perf_counter() - a)
        return round(float(np.median(ts[1:])) / rows * 1e6, 1)
    return {"vocab": vocab, "rows": rows, "upload_bytes_a_row": words * 4,
            "op_unmasked_us_a_row": timed(lambda: sample(z, temps, keys, bits, free, out)),
            "op_masked_us_a_row": timed(lambda: sample(z, temps, keys, bits, every, out)),
            "host_path_us_a_row": timed(host)}


def loop_cost(repeats: int, new: int, target: str, rows: int) -> dict:
    """kern's loop on the embedded model at `target`, `rows` requests at once, greedy, `new`
    tokens each: ms a decode step free and under a JSON-object grammar, the share of it spent in
    llguidance's batched mask call (the compute: Grammars.bitmasks, timed in place), and the
    logits rows the host read (0 where the device applies the mask). The lead's H200 hook:
    python bench/grammar.py --no-libraries --target cuda --rows 8"""
    import kern
    from kern.generation import SamplingParams
    from kern.generation.constraints import json_schema_grammar

    model = kern.load(progress=False, context=512, target=target)
    loop = model.loop
    tok = loop.tokenizer
    prompt = tok.chat([{"role": "user", "content": "Describe a person as JSON."}])
    free = SamplingParams(max_tokens=new, ignore_eos=True)
    bound = SamplingParams(max_tokens=new, ignore_eos=True, grammar=json_schema_grammar({"type": "object"}))
    model.warm_up(progress=False)
    model.generate_batch([prompt], [bound])  # llguidance's view of the vocabulary, built once
    loop.paging.pool.clear()
    spent, reads = [0.0, 0], []
    real_masks, real_rows = loop.grammars.bitmasks, loop.engine.read_rows

    def bitmasks(matchers):
        a = time.perf_counter()
        out = real_masks(matchers)
        spent[0] += time.perf_counter() - a
        spent[1] += len(matchers)
        return out
    loop.grammars.bitmasks = bitmasks
    loop.engine.read_rows = lambda buf, env, which: (reads.extend(which), real_rows(buf, env, which))[1]
    out = {"target": target, "rows": rows, "device_masks": loop.runner.masks}
    for name, p in (("free", free), ("json_object", bound)):
        runs, spent[:] = [], [0.0, 0]
        for _ in range(repeats):
            gs = model.generate_batch([prompt] * rows, [p] * rows)
            loop.paging.pool.clear()  # every run prefills: the same work each time
            runs.append(max(g.decode_s / g.decode_steps for g in gs))  # decode only: a document may end early
        out[name + "_ms_a_step"] = round(float(np.median(runs)) * 1e3, 3)
    out["constrained_extra_ms_a_step"] = round(out["json_object_ms_a_step"] - out["free_ms_a_step"], 3)
    out["llguidance_us_a_constrained_token"] = round(spent[0] / max(spent[1], 1) * 1e6, 1)
    out["logits_rows_read"] = len(reads)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--new", type=int, default=32, help="tokens a loop run decodes")
    ap.add_argument("--target", default="cpu", help="the loop's target (cuda: the device applies the mask)")
    ap.add_argument("--no-loop", action="store_true", help="the libraries alone")
    ap.add_argument("--no-libraries", action="store_true", help="the loop alone (llguidance timed inside it)")
    args = ap.parse_args()

    from kern.tokenizer import Tokenizer
    from kern_models.embedded import prepare

    tk = Tokenizer(prepare(progress=False)).tok
    result = {"machine": platform.processor() or platform.machine(), "rows": args.rows}
    if not args.no_libraries:
        ids = tk.encode(json.dumps(DOC), add_special_tokens=False).ids
        eos = 2
        result.update(doc_tokens=len(ids), llguidance=llguidance_cost(tk, ids, eos, args.rows),
                      xgrammar=xgrammar_cost(tk, ids, eos, args.rows),
                      mask_apply_cpu=apply_cost(tk.get_vocab_size(True), max(args.rows, 8), args.repeats * 10))
    if not args.no_loop:
        result["kern_loop"] = loop_cost(args.repeats, args.new, args.target, args.rows)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
