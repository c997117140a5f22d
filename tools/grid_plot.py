#!/usr/bin/env python3
"""Draws a grid table of docs/benchmarks.md as an SVG bar chart (no plotting library needed).

Reads the first Markdown table of a file (with `--after TEXT`: the first table after a line
holding TEXT), either as `tools/grid_table.py` prints it (set, protocol, T, D, then one column
per method) or with the column names of docs/benchmarks.md ("draft-free", "SSD", "BlockSpec
cal", "Spiffy cal", "Spiffy paper", "MRP", "SPOT", "oracle", "joint"), and draws, per row,
the mean forwards per prompt of every method in `--methods` as a group of bars. Cells that
are `-` or empty are left out. The docs' tables can be composed from several runs, so the
chart is drawn from the published table itself rather than from samples.

    python3 tools/grid_table.py /tmp/grid > grid.md
    python3 tools/grid_plot.py grid.md --title "T = 0" --out grid.svg
    python3 tools/grid_plot.py docs/benchmarks.md --after "## T = 0, every method live" \
        --title "T = 0" --out docs/img/grid-t0.svg
"""

import argparse
import sys
from pathlib import Path

METHODS = ["df", "ssd", "blockspec", "spiffy", "spiffy-paper", "mrp", "spot", "oracle", "oracle-joint"]
# docs/benchmarks.md's column names for grid_table.py's.
ALIASES = {
    "draft-free": "df",
    "SSD": "ssd",
    "BlockSpec cal": "blockspec",
    "Spiffy cal": "spiffy",
    "Spiffy paper": "spiffy-paper",
    "MRP": "mrp",
    "SPOT": "spot",
    "joint": "oracle-joint",
}
COLOURS = ["#999999", "#8c564b", "#1f77b4", "#2ca02c", "#98df8a", "#9467bd", "#d62728", "#ff7f0e", "#ffbb78"]


def parse(text: str, after: str | None) -> tuple[list[str], list[dict[str, str]]]:
    """The header and rows of the first Markdown table in `text` (after a line holding `after`)."""
    lines = text.splitlines()
    if after is not None:
        hits = [i for i, line in enumerate(lines) if after in line]
        if not hits:
            sys.exit(f"no line holds {after!r}")
        lines = lines[hits[0] + 1 :]
    table = []
    for line in lines:
        if line.strip().startswith("|"):
            table.append(line.strip())
        elif table:
            break
    if len(table) < 3:
        sys.exit("no Markdown table with a header, a rule and at least one row")
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in table]
    head = [ALIASES.get(c.replace("*", ""), c.replace("*", "")) for c in cells[0]]
    rows = [dict(zip(head, row)) for row in cells[2:]]
    return head, rows


def number(text: str) -> float | None:
    """The leading number of a cell (`69.93`, `**46.87** (3.11x)`), or None for `-` or empty."""
    token = text.replace("*", "").split(" ")[0]
    try:
        return float(token)
    except ValueError:
        return None


def draw(rows: list[dict[str, str]], methods: list[str], title: str) -> str:
    groups = []
    for row in rows:
        name = " ".join(row.get(k, "") for k in ("set", "protocol") if row.get(k))
        label = (name, " ".join(f"{k}={row[k]}" for k in ("T", "D") if row.get(k)))
        bars = [(m, number(row.get(m, ""))) for m in methods]
        groups.append((label, [(m, v) for m, v in bars if v is not None]))
    top = max((v for _, bars in groups for _, v in bars), default=1.0)
    bar, gap, left, height, base = 12, 30, 50, 240, 280
    width = max(left + sum(len(b) * bar + gap for _, b in groups) + 20, left + 4 * 110 + 20)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{base + 110}" font-family="sans-serif" font-size="10">',
        f'<text x="{left}" y="16" font-size="13">{title}: mean forwards per prompt (lower is better)</text>',
        f'<line x1="{left}" y1="{base}" x2="{width - 10}" y2="{base}" stroke="black"/>',
    ]
    for tick in range(0, int(top) + 1, 25):
        y = base - height * tick / top
        out.append(f'<text x="{left - 6}" y="{y + 3:.1f}" text-anchor="end">{tick}</text>')
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{width - 10}" y2="{y:.1f}" stroke="#eeeeee"/>')
    x = left + gap / 2
    for label, bars in groups:
        start = x
        for m, v in bars:
            h = height * v / top
            colour = COLOURS[METHODS.index(m) % len(COLOURS)] if m in METHODS else "#333333"
            out.append(
                f'<rect x="{x:.1f}" y="{base - h:.1f}" width="{bar - 1}" height="{h:.1f}" fill="{colour}"><title>{m}: {v:.2f}</title></rect>'
            )
            x += bar
        for i, line in enumerate(label):
            out.append(f'<text x="{(start + x) / 2:.1f}" y="{base + 14 + 12 * i}" text-anchor="middle">{line}</text>')
        x += gap
    for i, m in enumerate(methods):
        colour = COLOURS[METHODS.index(m) % len(COLOURS)] if m in METHODS else "#333333"
        lx = left + (i % 4) * 110
        ly = base + 50 + (i // 4) * 16
        out.append(f'<rect x="{lx}" y="{ly - 9}" width="10" height="10" fill="{colour}"/><text x="{lx + 14}" y="{ly}">{m}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("table", type=Path, help="Markdown file holding the table (- for stdin)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--after", default=None, help="use the first table after a line holding this text")
    ap.add_argument("--title", default="spot bench grid")
    ap.add_argument("--methods", default=",".join(METHODS), help="columns to draw, in order")
    a = ap.parse_args()
    text = sys.stdin.read() if str(a.table) == "-" else a.table.read_text()
    head, rows = parse(text, a.after)
    methods = [m for m in a.methods.split(",") if m in head]
    if not methods:
        sys.exit(f"none of {a.methods} is a column of the table ({', '.join(head)})")
    a.out.write_text(draw(rows, methods, a.title))
    print(f"wrote {a.out}: {len(rows)} cells, {len(methods)} methods")


if __name__ == "__main__":
    main()
