"""Where a decode step's time goes on the GPU: device time per launch, summed by kernel, and
the step three ways: the whole host step (write inputs, replay, read the tokens: what
bench/decode.py times), one replay with a sync, and replays back to back with one sync at the
end (the GPU's own time for the step, launch gaps and PDL overlap included), and what the
replayed step loses when one kernel's launches are left out of it.

    python bench/profile_step.py --shapes llama-3.2-1b --batch 1,16
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from decode import SHAPES, checkpoint, raw  # noqa: E402 (bench/ is the working directory's sibling)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--batch", default="1,16")
    ap.add_argument("--context", type=int, default=160)
    args = ap.parse_args()
    from kern.api import Model
    from kern.runtime.devices.cuda.profile import profile
    from kern.runtime.devices.cuda.graphs import capture
    from kern_models.llama.generator import generate

    for name in args.shapes.split(","):
        tmp = Path(tempfile.mkdtemp())
        ckpt = checkpoint(name, tmp / "ckpt")
        man = generate(json.loads((ckpt / "config.json").read_text()), tmp / "deploy", target="cuda", model=name)
        model = Model(man, ckpt, state_budget=2 << 30)
        for batch in [int(b) for b in args.batch.split(",")]:
            st = model.protocol.for_rows(batch, 1)
            (table,) = st.page_tables
            pages = raw(model).take(batch * (-(-args.context // 16)))
            pt = np.array(pages, np.int32).reshape(batch, -1)
            full = np.zeros((batch, model.engine.shapes[table.buffer][1]), np.int32)
            full[:, :pt.shape[1]] = pt
            inputs = {st.inputs["token"]: np.ones(batch, np.int32),
                      st.inputs["position"]: np.full(batch, args.context - 1, np.int32),
                      st.inputs["cu_seqlens"]: np.arange(batch + 1, dtype=np.int32), table.buffer: full}
            eng = model.engine
            env = eng.run(st.program, st.vars_for(batch, batch, reach=args.context), inputs)  # captures the graph
            prog = eng.programs[st.program]
            graph = prog._graphs[tuple(sorted(env.items()))]

            def per_step(fn, n=200):
                fn()
                eng.device.synchronize()
                t0 = time.perf_counter()
                for _ in range(n):
                    fn()
                eng.device.synchronize()
                return round((time.perf_counter() - t0) / n * 1e6, 1)
            host_step = per_step(lambda: eng.read(st.outputs["tokens"],
                                                  eng.run(st.program, st.vars_for(batch, batch, reach=args.context), inputs)))
            replay_sync = per_step(lambda: (graph.replay(eng.device.stream), eng.device.synchronize()))
            replay_only = per_step(lambda: graph.replay(eng.device.stream))
            # each kernel's share of the replayed step: the step replayed without that kernel's
            # launches (results are garbage, the timing is not), back to back, subtracted
            items = prog._cache[tuple(sorted(env.items()))]
            entries = sorted({l.entry for l in prog.planned})
            without = {}
            for entry in entries:
                keep = [it for it, l in zip(items, prog.planned) if l.entry != entry]
                g = capture(eng.device.stream, lambda: (prog._upload(env), prog._record(keep)), label=entry)
                without[entry] = round(replay_only - per_step(lambda: g.replay(eng.device.stream)), 1)
                g.destroy()
            eng.run(st.program, st.vars_for(batch, batch, reach=args.context), inputs)  # the step's buffers as they were
            rows = profile(prog, env)
            by = defaultdict(lambda: [0, 0.0])
            for _, entry, us in rows:
                by[entry][0] += 1
                by[entry][1] += us
            total = sum(us for _, _, us in rows)
            print(json.dumps({"shape": name, "batch": batch, "context": args.context, "launches": len(rows),
                              "sum_device_us": round(total, 1),
                              "host_step_us": host_step, "replay_sync_us": replay_sync,
                              "replay_back_to_back_us": replay_only,
                              "replay_us_saved_without": dict(sorted(without.items(), key=lambda x: -x[1])),
                              "by_kernel": {k: {"n": n, "us": round(t, 1), "share": round(t / total, 3)}
                                            for k, (n, t) in sorted(by.items(), key=lambda x: -x[1][1])}}),
                  flush=True)
            raw(model).give(pages)


if __name__ == "__main__":
    main()
