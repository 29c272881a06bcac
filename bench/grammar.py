"""Token-mask cost of a JSON schema: llguidance (what kern uses) beside xgrammar, on the embedded
model's tokenizer (SmolLM2, 49,152 tokens), then the cost inside kern's loop.

    pip install xgrammar   # not a kern dependency: it needs torch and transformers (docs/serve.md)
    python bench/grammar.py [--rows 16] [--repeats 5]

Each library walks the same document token by token: the time to build its view of the
vocabulary, to compile the schema, and to fill one row's mask a token (the first token, whose
mask is the widest, apart). --rows: masks for that many rows at once (llguidance's batched call,
as a step computes them). Then kern's loop decodes the embedded model on the CPU with and
without the schema (greedy, the same number of tokens): the difference a token is what a
constrained row costs, host draw included."""

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


def loop_cost(repeats: int, new: int) -> dict:
    import kern
    from kern.generation import SamplingParams
    from kern.generation.constraints import json_schema_grammar

    model = kern.load(progress=False, context=512)
    tok = model.loop.tokenizer
    prompt = tok.chat([{"role": "user", "content": "Describe a person as JSON."}])
    free = SamplingParams(max_tokens=new, ignore_eos=True)
    bound = SamplingParams(max_tokens=new, ignore_eos=True, grammar=json_schema_grammar({"type": "object"}))
    model.generate_batch([prompt], [bound])  # llguidance's view of the vocabulary, built once
    model.loop.paging.pool.clear()  # every run prefills: the same work each time
    out = {}
    for name, p in (("free", free), ("json_object", bound)):
        runs = []
        for _ in range(repeats):
            (g,) = model.generate_batch([prompt], [p])
            model.loop.paging.pool.clear()
            runs.append(g.decode_s / g.decode_steps)  # decode only: a document may end before `new`
        out[name + "_ms_per_token"] = round(float(np.median(runs)) * 1e3, 2)
    out["constrained_extra_ms_per_token"] = round(out["json_object_ms_per_token"] - out["free_ms_per_token"], 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--new", type=int, default=32, help="tokens a loop run decodes")
    ap.add_argument("--no-loop", action="store_true", help="the libraries alone")
    args = ap.parse_args()

    from kern.tokenizer import Tokenizer
    from kern_models.embedded import prepare

    tk = Tokenizer(prepare(progress=False)).tok
    ids = tk.encode(json.dumps(DOC), add_special_tokens=False).ids
    eos = 2
    result = {"machine": platform.processor() or platform.machine(), "rows": args.rows, "doc_tokens": len(ids),
              "llguidance": llguidance_cost(tk, ids, eos, args.rows), "xgrammar": xgrammar_cost(tk, ids, eos, args.rows)}
    if not args.no_loop:
        result["kern_loop_cpu"] = loop_cost(args.repeats, args.new)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
