#!/usr/bin/env python3
"""Markdown table of `bench run` summaries side by side: one row per method, one column per run.

    scripts/grid_table.py [--tasks t1,t2] LABEL=DIR [LABEL=DIR ...]
    scripts/grid_table.py --ratios DIR     # the press part of scripts/eval_model.sh

--ratios pivots one run whose methods are named as eval_model.sh's press part names them
(PRESS-RATIO-QUERY, PRESS-RATIO, PRESS-default-QUERY, and the press-free `full`): one row per
(press, query mode), one column per ratio, the average score in each cell.

Each DIR is a `bench run` output folder (its summary.csv), or several joined by ':' (their
methods merged into one column). A cell is the average score over the
run's tasks, followed by the per-task scores in the order of --tasks (default: every task of the
first run, sorted). Methods missing from a run show "-". Used for the grids in docs/model.md and
docs/kv-press.md.
"""
import argparse
import csv
import os
import sys


SHORT = {"niah_single_1": "ns1", "niah_single_2": "ns2", "niah_single_3": "ns3",
         "niah_multikey_1": "mk1", "niah_multikey_2": "mk2", "niah_multikey_3": "mk3",
         "niah_multivalue": "mv", "niah_multiquery": "mq", "passkey": "pk"}


def load(dirs):
    rows = {}
    for d in dirs.split(":"):
        with open(os.path.join(d, "summary.csv")) as f:
            for r in csv.DictReader(f):
                rows.setdefault(r["method"], {})[r["task"]] = float(r["score"])
    return rows


def ratio_table(d):
    rows = load(d)
    grid, ratios = {}, set()
    for m, r in rows.items():
        if "average" not in r or m == "full":
            continue
        parts = m.split("-")
        if len(parts) == 2:
            parts.append("aware")
        if len(parts) != 3:
            continue
        press, ratio, query = parts
        grid.setdefault((press, query), {})[ratio] = r["average"]
        ratios.add(ratio)
    cols = sorted((x for x in ratios if x != "default"), key=float)
    if "default" in ratios:
        cols.append("default")
    ref = rows.get("full", {}).get("average")
    if ref is not None:
        print(f"No press (`full`): {ref:.1f}.\n")
    print("| press | query | " + " | ".join(cols) + " |")
    print("|---|---|" + "---:|" * len(cols))
    for (press, query) in sorted(grid):
        cells = [f"{grid[(press, query)][c]:.1f}" if c in grid[(press, query)] else "" for c in cols]
        print(f"| {press} | {query} | " + " | ".join(cells) + " |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", default="")
    ap.add_argument("--ratios", default="", help="DIR: pivot a press grid by ratio")
    ap.add_argument("runs", nargs="*", help="LABEL=DIR")
    a = ap.parse_args()
    if a.ratios:
        ratio_table(a.ratios)
        return
    if not a.runs:
        sys.exit("grid_table: give LABEL=DIR runs or --ratios DIR")
    runs = []
    for spec in a.runs:
        if "=" not in spec:
            sys.exit(f"grid_table: '{spec}' is not LABEL=DIR")
        label, d = spec.rsplit("=", 1)
        runs.append((label, load(d)))
    tasks = [t for t in a.tasks.split(",") if t]
    if not tasks:
        first = next(iter(runs[0][1].values()))
        tasks = sorted(t for t in first if t != "average")
    methods = []
    for _, rows in runs:
        for m in rows:
            if m not in methods:
                methods.append(m)
    print("| method | " + " | ".join(f"{l} avg ({'/'.join(SHORT.get(t, t) for t in tasks)})" for l, _ in runs) + " |")
    print("|---|" + "---:|" * len(runs))
    for m in sorted(methods):
        cells = []
        for _, rows in runs:
            r = rows.get(m)
            if r is None or "average" not in r:
                cells.append("-")
                continue
            per = "/".join(f"{r[t]:.0f}" if t in r else "-" for t in tasks)
            cells.append(f"{r['average']:.0f} ({per})")
        print(f"| {m} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
