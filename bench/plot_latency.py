#!/usr/bin/env python3
"""Plot end-to-end latency percentiles per system and scenario from compare-nchan.sh output.

Usage: plot_latency.py RESULTS_DIR OUT.png

Reads RESULTS_DIR/<scenario>-<system>.json (bench --json output) and draws, per scenario, the
p50 / p99 / p99.9 / max latency of each system on a log scale. Not part of the test path; needs
matplotlib (pip install matplotlib).
"""
import glob
import json
import os
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SYSTEMS = ["nchan", "gateway"]
COLORS = {"nchan": "#d62728", "gateway": "#1f77b4"}
PCTS = [("p50_us", "p50"), ("p99_us", "p99"), ("p999_us", "p99.9"), ("max_us", "max")]


def main():
    src, dst = sys.argv[1], sys.argv[2]
    rounds = {}
    for path in sorted(glob.glob(os.path.join(src, "*-*.json"))):
        base = os.path.basename(path)[:-5].split(".r")[0]  # <scenario>-<system>[.rN]
        scenario, system = base.rsplit("-", 1)
        if system not in SYSTEMS or scenario == "idle":
            continue
        try:
            reports = json.load(open(path))["reports"]
        except (ValueError, KeyError):
            continue
        for r in reports:
            name = scenario if r["scenario"] != "slow-baseline" else scenario + " (baseline)"
            if r["latency"]["count"]:
                rounds.setdefault(name, {}).setdefault(system, []).append(r["latency"])
    # Median over rounds of each percentile.
    data = {
        sc: {
            system: {key: statistics.median(l[key] for l in lats) for key, _ in PCTS}
            for system, lats in by_sys.items()
        }
        for sc, by_sys in rounds.items()
    }
    scenarios = sorted(data)
    if not scenarios:
        sys.exit("no latency data in " + src)
    fig, axes = plt.subplots(1, len(scenarios), figsize=(3.2 * len(scenarios), 4), squeeze=False)
    for ax, sc in zip(axes[0], scenarios):
        width = 0.38
        for k, system in enumerate(SYSTEMS):
            lat = data[sc].get(system)
            if not lat:
                continue
            xs = [i + (k - 0.5) * width for i in range(len(PCTS))]
            ys = [max(lat[key], 1.0) for key, _ in PCTS]
            ax.bar(xs, ys, width, label=system, color=COLORS[system])
        ax.set_xticks(range(len(PCTS)))
        ax.set_xticklabels([label for _, label in PCTS])
        ax.set_yscale("log")
        ax.set_ylim(bottom=10)  # bars start at 10 us so their heights compare on the log scale
        ax.set_title(sc, fontsize=9)
        ax.grid(axis="y", which="both", alpha=0.3)
    axes[0][0].set_ylabel("end-to-end latency, us (log)")
    axes[0][0].legend()
    fig.suptitle(
        "publish -> subscriber receipt latency (median of rounds), server core 0 / bench core 1"
    )
    fig.tight_layout()
    fig.savefig(dst, dpi=110)
    print("wrote", dst)


if __name__ == "__main__":
    main()
