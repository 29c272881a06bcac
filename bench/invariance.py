"""Does a request get the same bytes alone, again (its prompt cached), chunked otherwise, and
inside batches? The issue's experiment, on seeded random weights at a real shape.

    python bench/invariance.py [--target cuda|cpu] [--shape smollm2-135m] [--new 64] [--no-batch-invariance]

One request (a 300-token prompt of random tokens; greedy with logprobs, so the host reads its
logits, and greedy on the device's argmax) is run: alone; again with its prompt in the prefix
cache; alone with its prompt fed in chunks of 16 tokens; then beside 7 and 63 other requests
(the gemv and the GEMM decode programs on sm_90a), their prompts prefilled beside its decode.
For each run against the first: whether tokens and logprobs are byte-identical, the first
token that differs, the largest logprob difference. One JSON line. --no-batch-invariance: the
faster cuda build (what that flag of kern serve runs), to say what it costs in determinism."""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np


def run(loop, first: list, then: list) -> dict[str, list]:
    """Each request's Deltas: `first` added at once, `then` after the first step (their prompts
    prefill beside the first ones' decode rows)."""
    for r in first:
        loop.add(*r)
    out: dict[str, list] = {}
    while loop.has_work() or then:
        for d in loop.step():
            out.setdefault(d.request_id, []).append(d)
        for r in then:
            loop.add(*r)
        then = []
    return out


def compare(a: list, b: list) -> dict:
    ta, tb = [t for d in a for t in d.token_ids], [t for d in b for t in d.token_ids]
    la, lb = [x for d in a for x in d.logprobs], [x for d in b for x in d.logprobs]
    first = next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), None)
    worst = max((abs(x.logprob - y.logprob) for x, y in zip(la, lb) if x.token == y.token), default=0.0)
    return {"identical": ta == tb and la == lb, "first_token_differs": first, "max_logprob_diff": worst}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--shape", default="smollm2-135m")
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=300, help="the request's prompt tokens (others: 20-400)")
    ap.add_argument("--beside", default="7,63", help="how many other requests share its steps, a run each")
    ap.add_argument("--no-batch-invariance", dest="batch_invariant", action="store_false",
                    help="the faster cuda build (prefill and the wide decode through cuBLASLt)")
    args = ap.parse_args()

    from kern.api import Model
    from kern.generation import SamplingParams
    from kern_models.common.random_checkpoint import make
    from kern_models.llama.generator import generate

    tmp = Path(tempfile.mkdtemp())
    ckpt = make(args.shape, tmp / "ckpt", device=args.target)
    man = generate(json.loads((ckpt / "config.json").read_text()), tmp / "deploy", target=args.target,
                   model=args.shape, context=2048, batch_invariant=args.batch_invariant)
    model = Model(man, ckpt, state_budget=4 << 30 if args.target == "cuda" else 1 << 30)
    loop = model.loop
    vocab = model.engine.consts["vocab"]
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, vocab, args.prompt).tolist()
    beside = [int(n) for n in args.beside.split(",")]
    others = [rng.integers(0, vocab, int(rng.integers(20, 400))).tolist() for _ in range(max(beside))]
    out: dict = {"target": args.target, "shape": args.shape, "batch_invariant": args.batch_invariant}
    base = loop.limits
    for mode, params in (("logprobs", SamplingParams(max_tokens=args.new, ignore_eos=True, logprobs=1)),
                         ("device_argmax", SamplingParams(max_tokens=args.new, ignore_eos=True))):
        def once(first, then=(), budget=None, cache=False):
            if not cache:
                loop.paging.pool.clear()
            loop.limits = base if budget is None else replace(base, budget=budget)
            return run(loop, list(first), list(then))["r"]

        me = [("r", prompt, params)]
        alone = once(me)
        res = {"again_cached": once(me, cache=True), "chunks_of_16": once(me, budget=16)}
        for n in beside:  # half the others first, it and the other half a step later: mixed steps
            rest = [(f"o{i}", p, params) for i, p in enumerate(others[:n])]
            res[f"beside_{n}"] = once(rest[:n // 2], me + rest[n // 2:])
        out[mode] = {k: compare(alone, v) for k, v in res.items()}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
