"""--compare B: two manifests priced on the same workload, call by call, read per span.

Pure: two bench results and kern test's diff of the two manifests (the spans kern test
judges), so a change's price sits next to its verdict. A span's time on either side is the
sum of its calls' p50; the calls outside spans are the same on both sides."""

from __future__ import annotations

from ..judge.diff import Diff


def _key(sc: dict) -> tuple:
    return sc["groups"], sc["rows"], sc["context"]


def compare(a: dict, b: dict, d: Diff) -> dict:
    by_b = {_key(sc): sc for sc in b["scenarios"]}
    rows = []
    for sa in a["scenarios"]:
        sb = by_b.get(_key(sa))
        if sb is None or sb["program"] != sa["program"]:
            continue
        ta = [c["us"]["p50"] for c in sa["calls"]]
        tb = [c["us"]["p50"] for c in sb["calls"]]
        spans = []
        for s in d.spans:
            if s.program != sa["program"]:
                continue
            ua, ub = sum(ta[s.a[0]:s.a[1]]), sum(tb[s.b[0]:s.b[1]])
            spans.append({"span": s.label, "ops": s.ops, "a_us": ua, "b_us": ub, "delta_us": ub - ua})
        rows.append({"groups": sa["groups"], "rows": sa["rows"], "context": sa["context"], "program": sa["program"],
                     "a_step_us": sa["step"]["untraced_us"]["p50"], "b_step_us": sb["step"]["untraced_us"]["p50"],
                     "a_calls_us": sum(ta), "b_calls_us": sum(tb), "spans": spans})
    only_a = sorted({_key(sc) for sc in a["scenarios"]} - {_key(sc) for sc in b["scenarios"]})
    return {"manifest": b["manifest"], "diff": d.summary(), "scenarios": rows,
            "only_a": [list(k) for k in only_a]}
