"""SmolLM2-135M (the embedded model) decode tok/s on the CPU: kern vs transformers eager, same run.

    python bench/cpu_decode.py [--new 64] [--threads N]

Greedy, a chat prompt, both in fp32 from the same bf16 checkpoint. Decode tok/s = new tokens
after the first / time after the first token (prefill excluded on both sides); the median of
--repeats runs is reported. transformers runs its own KV-cache loop (one forward per token)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    import torch
    import transformers

    import kern
    from kern_models.embedded import prepare

    ckpt = prepare(progress=False)
    model = kern.load(ckpt)
    ids = model.tokenizer.encode(model.tokenizer.chat([{"role": "user", "content":
                                 "Write a short story about a lighthouse keeper and a storm."}]))
    kern_runs = []
    for _ in range(args.repeats):
        g = model.generate(ids, max_tokens=args.new)
        assert len(g.tokens) == args.new, "the model stopped early; use a prompt that keeps it talking"
        kern_runs.append(g.decode_tok_s)

    from decode import cache_kw, cache_of  # bench/decode.py: the cache argument across transformers releases

    ref = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    kw = cache_kw(ref)
    x = torch.tensor([ids])

    def hf() -> float:
        """transformers' own decode loop: one forward per token over its KV cache, timed after prefill."""
        with torch.no_grad():
            out = ref(x, use_cache=True)
            cache, tok = cache_of(out), out.logits[:, -1:].argmax(-1)
            t = time.perf_counter()
            for _ in range(args.new - 1):
                out = ref(tok, **{kw: cache}, use_cache=True)
                cache, tok = cache_of(out), out.logits[:, -1:].argmax(-1)
            return (args.new - 1) / (time.perf_counter() - t)

    hf_runs = [hf() for _ in range(args.repeats)]
    k, h = sorted(kern_runs)[len(kern_runs) // 2], sorted(hf_runs)[len(hf_runs) // 2]
    print(json.dumps({
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "torch_threads": torch.get_num_threads(), "prompt_tokens": len(ids), "new_tokens": args.new,
        "kern_decode_tok_s": round(k, 1), "transformers_eager_fp32_decode_tok_s": round(h, 1),
        "ratio_kern_over_transformers": round(k / h, 2),
        "kern_runs": [round(r, 1) for r in kern_runs], "transformers_runs": [round(r, 1) for r in hf_runs],
    }, indent=1))


if __name__ == "__main__":
    main()
