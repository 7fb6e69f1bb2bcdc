#!/usr/bin/env python3
"""Prints per-child medians and forkhive-vs-naive ratios from criterion's saved estimates.

Usage: cargo bench --bench fork_prefix && python3 scripts/bench-report.py [group]
"""
import json
import pathlib
import sys

group = sys.argv[1] if len(sys.argv) > 1 else "fork_children"
root = pathlib.Path("target/criterion") / group
rows = {}
for est in sorted(root.glob("*/*/new/estimates.json")):
    # criterion turns the id "variant/size" into the directory "variant_size".
    variant, _, size = est.parts[-4].rpartition("_")
    n = est.parts[-3]
    median_ns = json.loads(est.read_text())["median"]["point_estimate"]
    rows[(variant, size, int(n))] = median_ns / int(n)

def fmt(ns):
    return f"{ns / 1000:.2f} µs" if ns < 1e6 else f"{ns / 1e6:.2f} ms"

variants = sorted({v for v, _, _ in rows})
base = [v for v in variants if v.startswith("naive")]
print(f"{'history':>8} {'children':>8} " + " ".join(f"{v + '/child':>22}" for v in variants) + "   ratio")
for size in ["10KiB", "100KiB", "1MiB"]:
    for n in (1, 8, 64):
        vals = [rows.get((v, size, n)) for v in variants]
        if None in vals:
            continue
        ours = [rows[(v, size, n)] for v in variants if not v.startswith("naive")]
        ratio = rows[(base[0], size, n)] / min(ours) if base and ours else float("nan")
        print(f"{size:>8} {n:>8} " + " ".join(f"{fmt(x):>22}" for x in vals) + f"   {ratio:,.0f}x")
