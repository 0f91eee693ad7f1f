#!/usr/bin/env python3
"""Markdown tables of `bench run` records for readers beside attention methods (docs/readers.md).

    scripts/readers_table.py [--svg FILE] DIR [DIR ...]

Reads each DIR's results.jsonl (the records of every sample) and prints two tables, one row per
(model, method) and one column per length:
  1. accuracy: the mean RULER score over the samples of every task, with the sample count, and
     the per-task means below the table;
  2. cost: per read, the mean model calls, the tokens the model processed (prompt tokens of all
     its calls plus generated tokens; for a method without a reader, the prompt plus the answer),
     the mean wall time, and document tokens per second (the sample's length / wall time).
A record counts once per (model, method, task, length, index); a later line replaces an earlier
one, as `bench run` resumes. A `--reader NAME` setting (labelled "reader NAME") and a --method
named NAME that runs that reader are one row. --svg writes the accuracy against length, one line per (model,
method), to FILE (an SVG drawn here, no plotting library needed).
"""
import json
import math
import os
import statistics
import sys
from collections import defaultdict

COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf"]


def write_svg(path, series, lengths):
    """series: [(label, [(length, score)])]; x on a log2 axis over lengths, y 0..100."""
    w, h, left, right, top, bottom = 840, 420, 60, 330, 40, 50
    lo, hi = math.log2(lengths[0]), math.log2(lengths[-1])
    span = hi - lo if hi > lo else 1.0
    x = lambda n: left + (math.log2(n) - lo) / span * (w - left - right)
    y = lambda s: top + (100 - s) / 100 * (h - top - bottom)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
           f'<rect width="{w}" height="{h}" fill="white"/>',
           f'<text x="{left}" y="22" font-size="14">Accuracy against length (mean over tasks)</text>']
    for s in range(0, 101, 20):
        out.append(f'<line x1="{left}" y1="{y(s):.1f}" x2="{w - right}" y2="{y(s):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 8}" y="{y(s) + 4:.1f}" text-anchor="end">{s}</text>')
    for n in lengths:
        out.append(f'<line x1="{x(n):.1f}" y1="{top}" x2="{x(n):.1f}" y2="{h - bottom}" stroke="#eee"/>')
        out.append(f'<text x="{x(n):.1f}" y="{h - bottom + 18}" text-anchor="middle">{fmt_len(n)}</text>')
    out.append(f'<text x="{(left + w - right) / 2}" y="{h - 10}" text-anchor="middle">length (tokens)</text>')
    for i, (label, pts) in enumerate(series):
        c = COLOURS[i % len(COLOURS)]
        dash = ' stroke-dasharray="6,4"' if (i // len(COLOURS)) % 2 else ""
        coords = " ".join(f"{x(n):.1f},{y(s):.1f}" for n, s in pts)
        out.append(f'<polyline points="{coords}" fill="none" stroke="{c}" stroke-width="2"{dash}/>')
        for n, s in pts:
            out.append(f'<circle cx="{x(n):.1f}" cy="{y(s):.1f}" r="3" fill="{c}"/>')
        ly = top + 16 * i
        out.append(f'<line x1="{w - right + 10}" y1="{ly}" x2="{w - right + 30}" y2="{ly}" stroke="{c}" stroke-width="2"{dash}/>')
        out.append(f'<text x="{w - right + 35}" y="{ly + 4}">{label.replace("&", "&amp;").replace("<", "&lt;")}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def fmt_len(n):
    if n % (1 << 20) == 0:
        return f"{n >> 20}M"
    if n % 1024 == 0:
        return f"{n >> 10}K"
    return str(n)


def main(dirs, svg=None):
    recs = {}
    for d in dirs:
        with open(os.path.join(d, "results.jsonl")) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                r = json.loads(line)
                # `--reader X` labels its setting "reader X"; a --method with name=X says X.
                if r["method"].startswith("reader ") and r.get("reader", "").startswith(r["method"][7:]):
                    r["method"] = r["method"][7:]
                key = (r["model"], r["method"], r["task"], r["length"], r["depth"], r["index"])
                recs[key] = r
    rows = defaultdict(lambda: defaultdict(list))  # (model, method) -> length -> records
    lengths, tasks = set(), set()
    for (model, method, task, length, _, _), r in recs.items():
        rows[(model, method)][length].append(r)
        lengths.add(length)
        tasks.add(task)
    lengths = sorted(lengths)
    tasks = sorted(tasks)
    name = lambda k: f"{k[1]} ({k[0]})"

    print("| method (model) | " + " | ".join(fmt_len(n) for n in lengths) + " |")
    print("|---|" + "---:|" * len(lengths))
    for k in sorted(rows):
        cells = []
        for n in lengths:
            rs = rows[k].get(n, [])
            cells.append(f"{sum(r['score'] for r in rs) / len(rs):.1f} ({len(rs)})" if rs else "")
        print(f"| {name(k)} | " + " | ".join(cells) + " |")
    print()
    print("Per task (mean score):")
    print()
    print("| method (model) | length | " + " | ".join(tasks) + " |")
    print("|---|---:|" + "---:|" * len(tasks))
    for k in sorted(rows):
        for n in lengths:
            rs = rows[k].get(n, [])
            if not rs:
                continue
            cells = []
            for t in tasks:
                ts = [r["score"] for r in rs if r["task"] == t]
                cells.append(f"{sum(ts) / len(ts):.0f}" if ts else "")
            print(f"| {name(k)} | {fmt_len(n)} | " + " | ".join(cells) + " |")
    print()
    print("| method (model) | length | model calls | tokens processed | wall time (median) | document tokens/s |")
    print("|---|---:|---:|---:|---:|---:|")
    for k in sorted(rows):
        for n in lengths:
            rs = rows[k].get(n, [])
            if not rs:
                continue
            reader = bool(rs[0].get("reader"))
            calls = sum(r.get("reader_calls", 0) if reader else 1 for r in rs) / len(rs)
            tokens = sum((r.get("reader_prompt_tokens", 0) if reader else r["n_prompt"]) + r["n_gen"] for r in rs) / len(rs)
            wall = statistics.median(r["t_prefill"] + r["t_decode"] for r in rs)
            tps = n / wall if wall > 0 else float("nan")
            print(f"| {name(k)} | {fmt_len(n)} | {calls:,.0f} | {tokens:,.0f} | {wall:.2f} s | {tps:,.0f} |")
    if svg:
        series = []
        for k in sorted(rows):
            pts = [(n, sum(r["score"] for r in rows[k][n]) / len(rows[k][n])) for n in lengths if rows[k].get(n)]
            series.append((name(k), pts))
        write_svg(svg, series, lengths)


if __name__ == "__main__":
    args = sys.argv[1:]
    svg = None
    if len(args) >= 2 and args[0] == "--svg":
        svg, args = args[1], args[2:]
    if not args:
        sys.exit(__doc__)
    main(args, svg)
