"""What kern bench shows: a table on the terminal and a chart of where each step's time goes.

The chart needs matplotlib, which kern does not depend on: it is imported only when a chart is
asked for, and its absence is one line saying how to get it."""

from __future__ import annotations

from pathlib import Path

from ..errors import KernError

TOP_OPS = 8


def _us(x: float) -> str:
    return f"{x:,.1f} us" if x < 10_000 else f"{x / 1e3:,.2f} ms"


def table(doc: dict) -> list[str]:
    d = doc["device"]
    out = [f"{doc['model']} on {d['kind']} ({d['name']}); manifest sha256 {doc['manifest']['sha256'][:12]}; "
           f"copy ceiling {doc['ceiling_gbps']:.1f} GB/s"]
    for sc in doc["scenarios"]:
        st = sc["step"]
        out.append("")
        ck = st["check"]
        out.append(f"{sc['program']}: {sc['groups']} x {sc['rows']} rows, context {sc['context']}: step p50 "
                   f"{_us(st['untraced_us']['p50'])} (host {_us(st['host_us']['p50'])}); its {sc['program_calls']} "
                   f"calls sum to {_us(ck['calls_us'])} = {ck['ratio']:.1%} of the step "
                   f"({'within' if ck['ok'] else 'NOT within'} {ck['within']:.0%}), base {_us(st['base_us']['p50'])}")
        out.append(f"  {'op':<22}{'calls':>6}{'p50 total':>14}{'share':>8}{'GB/s':>9}")
        for o in sc["ops"][:TOP_OPS]:
            gbps = o["bytes"] / o["us"] / 1e3 if o["us"] > 0 else 0.0
            out.append(f"  {o['op']:<22}{o['calls']:>6}{_us(o['us']):>14}{o['share']:>8.1%}{gbps:>9.1f}")
        if len(sc["ops"]) > TOP_OPS:
            out.append(f"  ... {len(sc['ops']) - TOP_OPS} more ops")
        iso = sc.get("isolate")
        if iso:
            out.append(f"  isolate: {len(iso['calls'])} distinct calls; gate: {iso['gate']['what']}")
            for c in sorted(iso["calls"], key=lambda c: -c["cold_us"]["p50"])[:TOP_OPS]:
                out.append(f"    {c['key'][:60]:<62} cold {_us(c['cold_us']['p50']):>11}  warm "
                           f"{_us(c['warm_us']['p50']):>11}")
    for dr in doc["dropped"]:
        out.append(f"dropped {dr['groups']} x {dr['rows']} rows, context {dr['context']}: {dr['why']}")
    cmp_ = doc.get("compare")
    if cmp_:
        out.append("")
        out.append(f"compare with {cmp_['manifest']['path']} (sha256 {cmp_['manifest']['sha256'][:12]}):")
        for line in cmp_["diff"]:
            out.append(f"  {line}")
        for sc in cmp_["scenarios"]:
            out.append(f"  {sc['program']} {sc['groups']} x {sc['rows']} @ {sc['context']}: step "
                       f"{_us(sc['a_step_us'])} -> {_us(sc['b_step_us'])}")
            for s in sc["spans"]:
                out.append(f"    {s['span']} ({s['ops']}): {_us(s['a_us'])} -> {_us(s['b_us'])} "
                           f"({s['delta_us']:+,.1f} us)")
    return out


def chart(doc: dict, path: str | Path) -> None:
    """One horizontal bar per scenario, split by op (the calls' p50 summed), as PNG or SVG."""
    path = Path(path)
    if path.suffix.lower() not in (".png", ".svg"):
        raise KernError(f"--chart {path}: give a .png or .svg file name")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise KernError("--chart needs matplotlib, which kern does not install: pip install matplotlib "
                        "(the JSON and the table need nothing more)") from None
    scs = doc["scenarios"]
    ops = list(dict.fromkeys(o["op"] for sc in scs for o in sc["ops"]))
    fig, ax = plt.subplots(figsize=(10, 1.5 + 0.5 * len(scs)))
    labels = [f"{sc['program']} {sc['groups']}x{sc['rows']} @{sc['context']}" for sc in scs]
    left = [0.0] * len(scs)
    cmap = plt.get_cmap("tab20")
    steps = [sc["step"]["untraced_us"]["p50"] for sc in scs]
    unit, scale = ("ms", 1e-3) if max(steps, default=0.0) >= 10_000 else ("us", 1.0)
    # an op's p50 sum can dip below zero when its calls are cheaper than the clock's noise
    for k, op in enumerate(ops):
        widths = [max(next((o["us"] for o in sc["ops"] if o["op"] == op), 0.0), 0.0) * scale for sc in scs]
        ax.barh(labels, widths, left=left, label=op, color=cmap(k % 20))
        left = [a + b for a, b in zip(left, widths)]
    ax.scatter([x * scale for x in steps], labels, marker="|", s=400, color="black", zorder=3,
               label="whole step (p50)")
    ax.set_xlabel(f"{unit} per step (bars: each op's calls, p50 summed; tick: the untraced step)")
    ax.set_title(f"{doc['model']} on {doc['device']['kind']}: where the step's time goes")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    try:
        fig.savefig(path, format=path.suffix[1:].lower(), bbox_inches="tight")
    except OSError as exc:
        raise KernError(f"--chart {path}: cannot write ({exc.strerror or exc})") from None
    finally:
        plt.close(fig)
