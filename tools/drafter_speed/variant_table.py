#!/usr/bin/env python3
"""SPOT in two variants side by side (order-network precision or tree expansion), from one
`spot bench` run.

    tools/drafter_speed/variant_table.py OUT/bench.json [A B]

A and B name the variants as the run's method names end (`spot@A`, `spot@B`): `f32 int8`
(the default; `--drafter-precision f32,int8`) or `layers best-first` (`--expand
layers,best-first`). Prints one Markdown row per (set, T, D): forwards of each and the change,
nodes scored and scorer calls per tree, draft milliseconds per round (median, p95), wall
seconds per decode, and, where Spiffy ran at that budget (`spiffy`, or `spiffy@A` and
`spiffy@B` when it ran in both: then both, A's first), the issue-45 wall ratio SPOT wall / (Spiffy wall x SPOT
forwards / Spiffy forwards) for each.
"""

import json
import sys


def main():
    if len(sys.argv) not in (2, 4):
        sys.exit(__doc__)
    va, vb = sys.argv[2:4] if len(sys.argv) == 4 else ("f32", "int8")
    with open(sys.argv[1], encoding="utf-8") as f:
        groups = json.load(f)["groups"]
    print(f"| set | T | D | forwards {va} | {vb} | change | nodes / calls per tree {va} | {vb} "
          f"| draft ms {va} (median, p95) | {vb} | wall s {va} / {vb} "
          f"| Spiffy forwards, wall s | wall ratio {va} / {vb} |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for g in groups:
        rows = {(r["method"], r["budget"]): r for r in g["rows"]}
        budgets = sorted({b for (m, b) in rows if m.startswith("spot@")})
        for d in budgets:
            a, b = rows.get((f"spot@{va}", d)), rows.get((f"spot@{vb}", d))
            if a is None or b is None:
                continue
            change = 100.0 * (b["mean_nfe"] / a["mean_nfe"] - 1.0)
            spiffy = [rows.get((f"spiffy@{v}", d)) or rows.get(("spiffy", d)) for v in (va, vb)]
            if all(s is not None for s in spiffy):
                ratio = [r["mean_wall_s"] / (s["mean_wall_s"] * r["mean_nfe"] / s["mean_nfe"])
                         for r, s in zip((a, b), spiffy)]
                shown = [f"{s['mean_nfe']:.2f}, {s['mean_wall_s']:.2f}" for s in spiffy]
                spiffy_cell = shown[0] if spiffy[0] is spiffy[1] else " / ".join(shown)
                ratios = f"{ratio[0]:.2f} / {ratio[1]:.2f}"
            else:
                spiffy_cell, ratios = "-", "-"
            work = [f"{r['scored_nodes_per_tree']:.1f} / {r['scorer_calls_per_tree']:.1f}"
                    for r in (a, b)]
            print(f"| {g['set']} | {g['temperature']} | {d} | {a['mean_nfe']:.2f} "
                  f"| {b['mean_nfe']:.2f} | {change:+.1f}% | {work[0]} | {work[1]} "
                  f"| {a['draft_ms_median']:.2f}, {a['draft_ms_p95']:.2f} "
                  f"| {b['draft_ms_median']:.2f}, {b['draft_ms_p95']:.2f} "
                  f"| {a['mean_wall_s']:.2f} / {b['mean_wall_s']:.2f} | {spiffy_cell} | {ratios} |")


if __name__ == "__main__":
    main()
