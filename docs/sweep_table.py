#!/usr/bin/env python3
"""Renders a `hpmoe sweep` CSV (sweep.csv) as the Markdown table of docs/REPRODUCTION.md."""
import csv
import sys

AXES_END = "policy"


def pct(x):
    return f"{100 * float(x):.1f}%"


def main(path):
    rows = list(csv.DictReader(open(path)))
    head = list(rows[0].keys())
    axes = head[1:head.index(AXES_END)]
    print("| configuration | policy | latency (us) | speedup vs KbK | efficiency | AIC busy "
          "| cube MAC util. | comm. active | comm. exposed | L2 hit |")
    print("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|")
    for r in rows:
        conf = ", ".join(f"{a}={r[a]}" for a in axes) or "base"
        lat = float(r["latency_us"])
        sp = r["speedup_vs_kernel_by_kernel"]
        sp = f"{float(sp):.3f}x" if sp else "-"
        print(f"| {conf} | {r['policy']} | {lat:.1f} | {sp} | {pct(r['efficiency'])} | "
              f"{pct(r['aic_busy'])} | {pct(r['cube_mac_utilisation'])} | "
              f"{pct(r['comm_active_us'] and float(r['comm_active_us']) / lat)} | "
              f"{pct(r['exposed_share'])} | {pct(r['l2_hit_rate'])} |")


if __name__ == "__main__":
    main(sys.argv[1])
