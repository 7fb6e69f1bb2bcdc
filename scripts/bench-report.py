#!/usr/bin/env python3
"""Prints medians and forkhive-vs-naive ratios from criterion's saved estimates.

Usage: cargo bench --bench fork_prefix && python3 scripts/bench-report.py [fork_children|fork_encode]
       cargo bench --bench agent_turns && python3 scripts/bench-report.py agent_turns
       cargo bench --bench send_message && python3 scripts/bench-report.py send_message
       cargo bench --bench mailbox && python3 scripts/bench-report.py mailbox
       cargo bench --bench mailbox && python3 scripts/bench-report.py notify
       cargo bench --bench fanout && python3 scripts/bench-report.py fanout
"""
import json
import pathlib
import sys

group = sys.argv[1] if len(sys.argv) > 1 else "fork_children"
root = pathlib.Path("target/criterion") / group


def median_ns(path):
    return json.loads(path.read_text())["median"]["point_estimate"]


def fmt(ns):
    return f"{ns / 1000:.2f} µs" if ns < 1e6 else f"{ns / 1e6:.2f} ms"


if group in ("mailbox", "notify"):
    # Ids are "<backend>/<writers>"; each iteration sends 200 letters (or notifications) and
    # acknowledges them.
    unit = "letters/s" if group == "mailbox" else "notes/s"
    print(f"{'backend':>8} {'writers':>8} {'median/200':>12} {unit:>10}")
    for est in sorted(root.glob("*/*/new/estimates.json")):
        backend, writers = est.parts[-4], est.parts[-3]
        ns = median_ns(est)
        print(f"{backend:>8} {writers:>8} {fmt(ns):>12} {200 / (ns / 1e9):>10,.0f}")
    sys.exit(0)

if group == "send_message":
    # Ids are "next_round" and "end_of_turn": send -> the request carrying the message.
    got = {est.parts[-3]: median_ns(est) for est in root.glob("*/new/estimates.json")}
    for name in ("next_round", "end_of_turn"):
        if name in got:
            print(f"{name:>12}: {fmt(got[name])} from send to the request that carries it")
    if "next_round" in got and "end_of_turn" in got:
        print(f"end_of_turn / next_round: {got['end_of_turn'] / got['next_round']:,.0f}x")
    sys.exit(0)

if group == "fanout":
    # Ids are "forkhive/<n>" and "naive/<n>" (the floor): one fan-out to n background children,
    # each median divided by n.
    if not any(root.glob("*/*/new/estimates.json")):
        sys.exit(f"no results under {root}: run `cargo bench --bench fanout` from the repository root first")
    got = {}
    for est in sorted(root.glob("*/*/new/estimates.json")):
        variant, n = est.parts[-4], int(est.parts[-3])
        got[(variant, n)] = median_ns(est) / n
    print(f"{'children':>8} {'forkhive/child':>15} {'floor/child':>12} {'forkhive - floor':>17} {'ratio':>6}")
    for n in sorted({n for _, n in got}):
        ours, floor = got.get(("forkhive", n)), got.get(("naive", n))
        if ours is None or floor is None:
            continue
        print(f"{n:>8} {fmt(ours):>15} {fmt(floor):>12} {fmt(ours - floor):>17} {ours / floor:>5.1f}x")
    sys.exit(0)

if group == "agent_turns":
    # Ids are "forkhive/<turn>" and "naive/<turn>": one turn on a conversation of that length.
    turns = {}
    for est in sorted(root.glob("*/*/new/estimates.json")):
        variant, turn = est.parts[-4], int(est.parts[-3])
        turns[(variant, turn)] = median_ns(est)
    print(f"{'variant':>10} {'turn':>6} {'median/turn':>14}")
    for (variant, turn), ns in sorted(turns.items()):
        print(f"{variant:>10} {turn:>6} {fmt(ns):>14}")
    ours = {t: ns for (v, t), ns in turns.items() if v == "forkhive"}
    naive = {t: ns for (v, t), ns in turns.items() if v == "naive"}
    if ours:
        first, last = min(ours), max(ours)
        growth = ours[last] / ours[first]
        verdict = "ok" if growth <= 1.5 else "MISSED"
        print(f"turn {last} / turn {first}: {growth:.2f}x (goal <= 1.5x: {verdict})")
    for t, ns in sorted(naive.items()):
        if t in ours:
            speedup = ns / ours[t]
            verdict = "ok" if speedup >= 50 else "MISSED"
            print(f"naive / forkhive at turn {t}: {speedup:,.0f}x (goal >= 50x: {verdict})")
    sys.exit(0)

rows = {}
for est in sorted(root.glob("*/*/new/estimates.json")):
    # criterion turns the id "variant/size" into the directory "variant_size".
    variant, _, size = est.parts[-4].rpartition("_")
    n = est.parts[-3]
    rows[(variant, size, int(n))] = median_ns(est) / int(n)

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
