#!/usr/bin/env python3
"""SPOT's order network in f32 against int8, side by side, from one `spot bench` run.

    tools/drafter_speed/precision_table.py OUT/bench.json

The run is `spot bench ... --methods spot,spiffy --drafter-precision f32,int8`. Prints one
Markdown row per (set, T, D): forwards at each precision and the change, draft milliseconds
per round (median, p95), wall seconds per decode, and, where Spiffy ran at that budget, the
issue-45 wall ratio SPOT wall / (Spiffy wall x SPOT forwards / Spiffy forwards) for each.
"""

import json
import sys


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    with open(sys.argv[1], encoding="utf-8") as f:
        groups = json.load(f)["groups"]
    print("| set | T | D | forwards f32 | int8 | change | draft ms f32 (median, p95) "
          "| int8 | wall s f32 / int8 | Spiffy forwards, wall s | wall ratio f32 / int8 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for g in groups:
        rows = {(r["method"], r["budget"]): r for r in g["rows"]}
        budgets = sorted({b for (m, b) in rows if m.startswith("spot@")})
        for d in budgets:
            a, b = rows.get(("spot@f32", d)), rows.get(("spot@int8", d))
            if a is None or b is None:
                continue
            change = 100.0 * (b["mean_nfe"] / a["mean_nfe"] - 1.0)
            s = rows.get(("spiffy", d))
            if s is not None:
                ratio = [r["mean_wall_s"] / (s["mean_wall_s"] * r["mean_nfe"] / s["mean_nfe"])
                         for r in (a, b)]
                spiffy = f"{s['mean_nfe']:.2f}, {s['mean_wall_s']:.2f}"
                ratios = f"{ratio[0]:.2f} / {ratio[1]:.2f}"
            else:
                spiffy, ratios = "-", "-"
            print(f"| {g['set']} | {g['temperature']} | {d} | {a['mean_nfe']:.2f} "
                  f"| {b['mean_nfe']:.2f} | {change:+.1f}% "
                  f"| {a['draft_ms_median']:.2f}, {a['draft_ms_p95']:.2f} "
                  f"| {b['draft_ms_median']:.2f}, {b['draft_ms_p95']:.2f} "
                  f"| {a['mean_wall_s']:.2f} / {b['mean_wall_s']:.2f} | {spiffy} | {ratios} |")


if __name__ == "__main__":
    main()
