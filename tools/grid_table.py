#!/usr/bin/env python3
"""Summarises `tools/bench_grid.sh` output as the Markdown table of docs/benchmarks.md.

Reads every `samples.jsonl` under the grid folder and prints, per (set, protocol, T, D), the mean NFE
per prompt of each method over the first `--limit` prompts (all by default), SPOT against the
best training-free baseline (SSD, BlockSpec, Spiffy calibrated and paper, MRP; the oracles
are bounds) and the position and joint oracles' NFE over SPOT's. Every decode must be marked equal to
draft-free; a decode that is not is an error.

    python3 tools/grid_table.py target/bench-grid [--limit 12]
"""

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

BASELINES = ["ssd", "blockspec", "spiffy", "spiffy-paper", "mrp"]
COLUMNS = ["df", *BASELINES, "spot", "oracle", "oracle-token", "oracle-joint"]


def read(grid: Path, limit: int | None):
    """{(set, protocol, T, D): {method: {id: nfe}}} over the first `limit` prompts."""
    cells = defaultdict(lambda: defaultdict(dict))
    for path in sorted(grid.glob("*/samples.jsonl")):
        paper = path.parent.name.endswith("-paper")
        order = {}
        for line in path.read_text().splitlines():
            s = json.loads(line)
            if not s.get("equal", False):
                sys.exit(f"{path}: {s['method']} on {s['id']} differs from draft-free")
            method = s["method"] + ("-paper" if paper and s["method"] != "df" else "")
            order.setdefault(s["id"], len(order))
            if limit is not None and order[s["id"]] >= limit:
                continue
            key = (s["set"], s.get("protocol", "fixed"), s["temperature"], s.get("budget"))
            cells[key][method][s["id"]] = s["nfe"]
    return cells


def order(cell) -> tuple:
    """Rows by set, protocol, then numeric temperature and budget."""
    (set_, protocol, t, d), _ = cell
    return (set_, protocol, float(t), -1 if d is None else d)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("grid", type=Path)
    ap.add_argument("--limit", type=int, default=None)
    a = ap.parse_args()
    cells = read(a.grid, a.limit)
    df = {k[:3]: v["df"] for k, v in cells.items() if k[3] is None}
    head = ["set", "protocol", "T", "D", "n", *COLUMNS, "SPOT vs best baseline"]
    head += ["oracle / SPOT", "joint / SPOT"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for (set_, protocol, t, d), methods in sorted(cells.items(), key=order):
        if d is None:
            continue
        reference = df.get((set_, protocol, t), {})
        methods = {m: v for m, v in {**methods, "df": reference}.items() if v}
        # Means over the prompts every method finished (an interrupted run has fewer).
        ids = set.intersection(*(set(v) for v in methods.values()))
        n = len(ids)
        mean = {m: sum(v[i] for i in ids) / n for m, v in methods.items() if n}
        row = [set_, protocol, t, str(d), str(n)]
        row += [f"{mean[m]:.2f}" if m in mean else "-" for m in COLUMNS]
        base = [(mean[m], m) for m in BASELINES if m in mean]
        if "spot" in mean and base:
            best, who = min(base)
            row.append(f"{100 * (1 - mean['spot'] / best):+.1f}% ({who})")
        else:
            row.append("-")
        for bound in ("oracle", "oracle-joint"):
            ratio = mean.get(bound, 0) / mean["spot"] if "spot" in mean else 0
            row.append(f"{ratio:.2f}" if ratio else "-")
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
