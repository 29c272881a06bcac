"""Where a decode step's time goes on the GPU: device time per launch, summed by kernel.

    python bench/profile_step.py --shapes llama-3.2-1b --batch 1,16
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np

from decode import SHAPES, checkpoint  # noqa: E402 (bench/ is the working directory's sibling)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--batch", default="1,16")
    ap.add_argument("--context", type=int, default=160)
    args = ap.parse_args()
    from kern.api import Model
    from kern.runtime.devices.cuda.device import profile
    from kern_models.llama.generator import generate

    for name in args.shapes.split(","):
        tmp = Path(tempfile.mkdtemp())
        ckpt = checkpoint(name, tmp / "ckpt")
        man = generate(json.loads((ckpt / "config.json").read_text()), tmp / "deploy", target="cuda", model=name)
        model = Model(man, ckpt, state_budget=2 << 30)
        for batch in [int(b) for b in args.batch.split(",")]:
            st = model.protocol.for_rows(batch, 1)
            (table,) = st.page_tables
            pages = model.alloc.take(batch * (-(-args.context // 16)))
            pt = np.array(pages, np.int32).reshape(batch, -1)
            full = np.zeros((batch, model.engine.shapes[table.buffer][1]), np.int32)
            full[:, :pt.shape[1]] = pt
            env = model.engine.run(st.program, st.vars_for(batch, batch), {
                st.inputs["token"]: np.ones(batch, np.int32),
                st.inputs["position"]: np.full(batch, args.context - 1, np.int32),
                st.inputs["cu_seqlens"]: np.arange(batch + 1, dtype=np.int32), table.buffer: full})
            rows = profile(model.engine.programs[st.program], env)
            by = defaultdict(lambda: [0, 0.0])
            for _, entry, us in rows:
                by[entry][0] += 1
                by[entry][1] += us
            total = sum(us for _, _, us in rows)
            print(json.dumps({"shape": name, "batch": batch, "context": args.context, "launches": len(rows),
                              "sum_device_us": round(total, 1),
                              "by_kernel": {k: {"n": n, "us": round(t, 1), "share": round(t / total, 3)}
                                            for k, (n, t) in sorted(by.items(), key=lambda x: -x[1][1])}}),
                  flush=True)
            model.alloc.give(pages)


if __name__ == "__main__":
    main()
