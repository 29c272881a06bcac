"""What batch invariance costs Kimi-Linear on the CPU: a seeded random Kimi-Linear's cpu
deployment of this tree (the prompt's KDA recurrence a token at a time through decode's step,
MLA prefill a row at a time through decode's absorbed arithmetic) beside a peer (the chunked
recurrence, kda_form="chunked", with the peer's kimi_linear cpu kernel module, e.g. the one of
before), in one process, interleaved.

    git show <rev>:models/kimi_linear/kernels/cpu/kernels.py > /tmp/kimi_peer.py
    python bench/kimi_cpu_invariance.py --peer /tmp/kimi_peer.py --shape tiny
    python bench/kimi_cpu_invariance.py --peer /tmp/kimi_peer.py --shape wide --new 8 --batch 4 --repeats 1

--shape tiny is CI's; wide is Kimi-Linear-48B-A3B's widths (32 KDA heads of 128, MLA's latent of
512, hidden 2304) at 4 layers (3 KDA, 1 MLA), 16 experts, a 32,768 vocabulary. For each: decode
tok/s of one greedy stream (--new tokens after a 40-token prompt), the output tok/s of --batch
such streams, prefill tok/s of a 256-token prompt (bench/cpu_invariance.py's measure). Medians
of the repeats; one JSON line. Needs torch and transformers (the random checkpoint)."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from cpu_invariance import side_by_side, swapped  # bench/ is this script's sys.path[0]

SHAPES = {"tiny": ("tiny", {}),
          "wide": ("kimi-linear-48b-a3b", dict(layers=4, num_local_experts=16, vocab_size=32768))}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--peer", type=Path, required=True, help="the peer's kimi_linear cpu kernel module")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--batch", type=int, default=16)
    args = ap.parse_args()

    from kern.api import Model
    from kern_models.kimi_linear.generator import generate
    from kern_models.kimi_linear.random_checkpoint import make

    name, kw = SHAPES[args.shape]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        ckpt = make(name, root / "ckpt", max_positions=512, **kw)
        cfg = json.loads((ckpt / "config.json").read_text())
        deps = {"invariant": generate(cfg, root / "invariant", target="cpu", context=512, seqs=args.batch + 1),
                "peer": swapped(generate(cfg, root / "peer", target="cpu", context=512, seqs=args.batch + 1,
                                         kda_form="chunked").parent, "kimi", args.peer, root / "peer")}
        models = {n: Model(m, ckpt) for n, m in deps.items()}
        ids = [(7919 + i * 104729) % (cfg["vocab_size"] - 3) + 3 for i in range(40)]
        out = side_by_side(models, ids, args.new, args.repeats, args.batch)
    print(json.dumps({"shape": args.shape, **out}))


if __name__ == "__main__":
    main()
