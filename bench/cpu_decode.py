"""`kern run` decode tok/s on the CPU (the embedded SmolLM2-135M-Instruct) beside transformers
eager, interleaved, same prompt, greedy, the same tokens checked.

    python bench/cpu_decode.py [--new 64] [--repeats 3]

Each repeat runs the command a user runs, `kern run --chat --prompt P --max-tokens N --target
cpu` (a fresh process: its own "decode ... tok/s" line is the number), then transformers' own
KV-cache loop in this process (fp32 from the same checkpoint, one forward a token, timed after
the first token as kern's decode is), so both see the same load. The generated text must be
the same on both sides (greedy): the numbers are for the same tokens. Medians are reported with
the load average around the runs, since a shared box's other jobs move both."""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time

PROMPT = "Write a short story about a lighthouse keeper and a storm."


def kern_run(new: int) -> tuple[float, str]:
    r = subprocess.run([sys.executable, "-m", "kern.cli", "run", "--chat", "--prompt", PROMPT, "--max-tokens",
                        str(new), "--target", "cpu"], capture_output=True, text=True, check=True)
    m = re.search(r"decode (\d+) tokens: ([\d.]+) tok/s \| finish: (\w+)", r.stderr)
    if m is None or int(m.group(1)) != new:
        raise SystemExit(f"kern run did not make {new} tokens: {r.stderr[-400:]}")
    return float(m.group(2)), r.stdout.removesuffix("\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    import torch
    import transformers

    from kern.tokenizer import Tokenizer
    from kern_models.embedded import prepare

    from decode import cache_kw, cache_of  # bench/decode.py: the cache argument across transformers releases

    ckpt = prepare(progress=False)
    tok = Tokenizer(ckpt)
    ids = tok.encode(tok.chat([{"role": "user", "content": PROMPT}]))
    ref = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    kw = cache_kw(ref)
    x = torch.tensor([ids])

    def hf() -> tuple[float, list[int]]:
        """transformers' own decode loop: one forward per token over its KV cache, timed after the first token."""
        with torch.no_grad():
            out = ref(x, use_cache=True)
            cache, t1 = cache_of(out), out.logits[:, -1:].argmax(-1)
            made = [int(t1)]
            t = time.perf_counter()
            for _ in range(args.new - 1):
                out = ref(t1, **{kw: cache}, use_cache=True)
                cache, t1 = cache_of(out), out.logits[:, -1:].argmax(-1)
                made.append(int(t1))
            return (args.new - 1) / (time.perf_counter() - t), made

    load0 = os.getloadavg()[0]
    kern_runs, hf_runs = [], []
    for _ in range(args.repeats):
        k, text = kern_run(args.new)
        h, made = hf()
        if tok.decode(made) != text:
            raise SystemExit(f"not the same tokens:\nkern run:     {text!r}\ntransformers: {tok.decode(made)!r}")
        kern_runs.append(k)
        hf_runs.append(h)
    k, h = sorted(kern_runs)[len(kern_runs) // 2], sorted(hf_runs)[len(hf_runs) // 2]
    print(json.dumps({
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "load_average_before_after": [round(load0, 2), round(os.getloadavg()[0], 2)],
        "torch_threads": torch.get_num_threads(), "prompt_tokens": len(ids), "new_tokens": args.new,
        "same_tokens": True,
        "kern_run_decode_tok_s": round(k, 1), "transformers_eager_fp32_decode_tok_s": round(h, 1),
        "ratio_kern_over_transformers": round(k / h, 2),
        "kern_runs": [round(r, 1) for r in kern_runs], "transformers_runs": [round(r, 1) for r in hf_runs],
    }, indent=1))


if __name__ == "__main__":
    main()
