#!/usr/bin/env python3
"""plot.py: PNG plots of bench results (the JSON `bench --json` / `--json-file` writes).

  scripts/plot.py latency DIR [DIR ...] [--out PNG] [--only SCENARIO[,SCENARIO...]]
      The end-to-end latency distribution (publish -> subscriber receipt) of the gateway
      beside nginx + nchan, one panel per scenario, from `scripts/compare-nchan.sh` output
      directories (<scenario>-<system>[.rN].json). A percentile plot: x is the percentile on
      a "nines" scale (p50, p90, p99, p99.9, ...), y the latency on a log scale; the median
      over rounds at each percentile. Reports with `latency_cdf_us` give the whole curve;
      older ones only p50 / p99 / p99.9 / max, drawn as those points.
  scripts/plot.py durable FILE[=LABEL] [FILE[=LABEL] ...] [--out PNG]
      Durable publish rate (acknowledged events/s) and publish latency p50 / p99 against the
      number of sequential publishers, from `bench durable --json` files (what
      `scripts/bench-durable.sh` keeps as durable-group.json and durable-never.json) or from
      older bench-durable.sh text logs (their `bench durable` tables: "## 1." is --fsync
      group, "## 2." --fsync never). Files with the same LABEL (default: the file's name
      without extension) are one series: the median per publisher count, bars from the
      lowest to the highest run.

  scripts/plot.py self-test
      Checks the input parsers on inline samples (no matplotlib needed); exit 1 on a failure.

matplotlib is installed on first use into a venv under .tools/plot-venv (pip, from PyPI); the
script then runs itself again with that venv's Python. Nothing is installed system-wide.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(ROOT, ".tools", "plot-venv")
MATPLOTLIB = "matplotlib==3.9.2"
SYSTEMS = ["nchan", "gateway"]
COLORS = {"nchan": "#d62728", "gateway": "#1f77b4"}


def ensure_matplotlib() -> None:
    """Imports matplotlib, or installs it into VENV and re-runs this script there."""
    try:
        import matplotlib  # noqa: F401

        return
    except ImportError:
        pass
    python = os.path.join(VENV, "bin", "python")
    if os.path.realpath(sys.prefix) == os.path.realpath(VENV):
        sys.exit(f"plot.py: matplotlib is missing from {VENV}; remove it to reinstall")
    if not os.path.exists(python):
        print(f"plot.py: creating {VENV}", file=sys.stderr)
        subprocess.check_call([sys.executable, "-m", "venv", VENV])
    if subprocess.run([python, "-c", "import matplotlib"], capture_output=True).returncode != 0:
        print(f"plot.py: installing {MATPLOTLIB} into {VENV}", file=sys.stderr)
        subprocess.check_call(
            [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", MATPLOTLIB]
        )
    os.execv(python, [python, os.path.abspath(__file__), *sys.argv[1:]])


def provenance(metas: list[dict | None]) -> str:
    """A line naming the commits and kernels of the inputs' `meta` objects (None: an input
    without one)."""
    missing = sum(m is None for m in metas)
    metas = [m for m in metas if m is not None]
    if not metas:
        return "inputs without a meta object (before bench recorded one)"
    without = f"; {missing} of {missing + len(metas)} inputs without meta" if missing else ""
    commits = sorted({m.get("commit", "?") for m in metas})
    kernels = sorted({m.get("kernel_release") or "?" for m in metas})
    loads = [m["loadavg_start"][0] for m in metas if m.get("loadavg_start")]
    load = f"; load average at start {min(loads):.1f}-{max(loads):.1f}" if loads else ""
    return f"commit {', '.join(commits)}; kernel {', '.join(kernels)}{load}{without}"


def save(fig, title: str, metas: list[dict | None], out: str) -> None:
    """Titles the figure (with the inputs' provenance) and writes it to `out` as PNG."""
    fig.suptitle(f"{title}\n{provenance(metas)}", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    print("wrote", out)


# --------------------------------------------------------------------------------------------
# Latency distributions (compare-nchan.sh)


def nines(q: float, count: int) -> float:
    """x position of quantile q: -log10(1 - q); the maximum sits at 1 - 1/count."""
    if q >= 1.0:
        q = 1.0 - 1.0 / max(count, 10)
    return -math.log10(1.0 - q)


def latency_points(report: dict) -> dict[float, float]:
    """{quantile: microseconds} of a load report's (fast) subscriber latency."""
    lat = report.get("latency") or {}
    count = lat.get("count") or 0
    if not count:
        return {}
    cdf = report.get("latency_cdf_us")
    if cdf:
        # Quantiles finer than 1/count say nothing the maximum does not: drawn once, as it.
        return {q: us for q, us in cdf if q >= 1.0 or 1.0 - q >= 1.0 / count}
    return {0.5: lat["p50_us"], 0.99: lat["p99_us"], 0.999: lat["p999_us"], 1.0: lat["max_us"]}


def load_latency(dirs: list[str], only: set[str] | None,
                 metas: list[dict | None]) -> dict[str, dict[str, list[tuple[int, dict]]]]:
    """{scenario: {system: [(count, points) per round]}} from compare-nchan.sh directories (of
    the scenarios in `only`, if given); the used files' `meta` objects go to `metas`."""
    data: dict[str, dict[str, list[tuple[int, dict]]]] = {}
    for d in dirs:
        for path in sorted(glob.glob(os.path.join(d, "*-*.json"))):
            base = os.path.basename(path)[:-5].split(".r")[0]  # <scenario>-<system>[.rN]
            scenario, _, system = base.rpartition("-")
            if system not in SYSTEMS or (only and scenario not in only):
                continue
            try:
                doc = json.load(open(path))
                reports = doc["reports"]
            except (ValueError, KeyError, OSError):
                continue
            report = reports[-1]  # slow: [baseline, slow]; the scenario's own is last
            points = latency_points(report)
            if points:
                metas.append(doc.get("meta"))
                count = report["latency"]["count"]
                data.setdefault(scenario, {}).setdefault(system, []).append((count, points))
    return data


def plot_latency(args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metas: list[dict | None] = []
    data = load_latency(args.dirs, set(args.only.split(",")) if args.only else None, metas)
    scenarios = sorted(sc for sc, by in data.items() if by)
    if not scenarios:
        sys.exit("plot.py: no latency data in " + ", ".join(args.dirs))
    cols = min(3, len(scenarios))
    rows = math.ceil(len(scenarios) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.6 * rows), squeeze=False)
    ticks = [0.5, 0.9, 0.99, 0.999, 0.9999, 0.99999]
    for ax, sc in zip(axes.flat, scenarios):
        for system in SYSTEMS:
            rounds = data[sc].get(system)
            if not rounds:
                continue
            count = int(statistics.median(c for c, _ in rounds))
            qs = sorted({q for _, pts in rounds for q in pts})
            ys = [statistics.median(p[q] for _, p in rounds if q in p) for q in qs]
            xs = [nines(q, count) for q in qs]
            label = f"{system} ({len(rounds)} round{'s' if len(rounds) > 1 else ''})"
            ax.plot(xs, ys, marker="o", ms=3, label=label, color=COLORS[system])
        ax.set_yscale("log")
        ax.set_xticks([nines(q, 0) for q in ticks])
        ax.set_xticklabels([f"p{q * 100:g}" for q in ticks], fontsize=8)
        ax.set_title(sc, fontsize=9)
        ax.grid(which="both", alpha=0.3)
        ax.set_ylabel("latency, µs (log)")
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(scenarios):]:
        ax.set_visible(False)
    title = args.title or ("publish → subscriber receipt latency, gateway vs nginx + nchan "
                           "(median over rounds; each line's last point: the maximum)")
    save(fig, title, metas, args.out)


# --------------------------------------------------------------------------------------------
# Durable publish rate against publishers (bench-durable.sh)

ROW = re.compile(r"^\s*(\d+) \|\s*([\d.]+) \|\s*([\d.]+) \|\s*([\d.]+) \|")


def durable_rows_of_text(text: str) -> dict[str, list[dict]]:
    """{"group"|"never": rows} from a bench-durable.sh text log's `bench durable` tables."""
    out: dict[str, list[dict]] = {}
    mode = None
    for line in text.splitlines():
        if line.startswith("## "):
            mode = "group" if line.startswith("## 1.") else "never" if line.startswith("## 2.") else None
            continue
        m = ROW.match(line)
        if mode and m:
            out.setdefault(mode, []).append({
                "publishers": int(m[1]), "events_per_sec": float(m[2]),
                "latency": {"p50_ms": float(m[3]), "p99_ms": float(m[4])},
            })
    return out


def load_durable(specs: list[str], metas: list[dict | None]) -> dict[str, list[dict]]:
    """{series label: rows} from FILE[=LABEL] arguments (JSON reports or text logs); the
    JSON files' `meta` objects are appended to `metas`."""
    series: dict[str, list[dict]] = {}
    for spec in specs:
        path, _, label = spec.partition("=")
        label = label or os.path.splitext(os.path.basename(path))[0]
        text = open(path).read()
        if path.endswith(".json"):
            doc = json.loads(text)
            series.setdefault(label, []).extend(doc["rows"])
            metas.append(doc.get("meta"))
        else:
            metas.append(None)
            for mode, rows in durable_rows_of_text(text).items():
                series.setdefault(f"{label}, --fsync {mode}", []).extend(rows)
    return series


def plot_durable(args: argparse.Namespace) -> None:
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metas: list[dict | None] = []
    series = load_durable(args.files, metas)
    if not any(series.values()):
        sys.exit("plot.py: no durable rows in " + ", ".join(args.files))
    fig, (rate_ax, lat_ax) = plt.subplots(1, 2, figsize=(11, 4))
    for i, (label, rows) in enumerate(sorted(series.items())):
        by_n: dict[int, list[dict]] = {}
        for r in rows:
            by_n.setdefault(r["publishers"], []).append(r)
        ns = sorted(by_n)
        rates = [[r["events_per_sec"] for r in by_n[n]] for n in ns]
        med = [statistics.median(v) for v in rates]
        err = [[m - min(v) for m, v in zip(med, rates)], [max(v) - m for m, v in zip(med, rates)]]
        color = f"C{i}"
        runs = max(len(v) for v in rates)
        rate_ax.errorbar(ns, med, yerr=err, marker="o", capsize=3, color=color,
                         label=f"{label} ({runs} run{'s' if runs > 1 else ''})")
        for key, style in (("p50_ms", "-"), ("p99_ms", ":")):
            ys = [statistics.median(r["latency"][key] for r in by_n[n]) for n in ns]
            lat_ax.plot(ns, ys, style, marker="o", color=color)
    for ax in (rate_ax, lat_ax):
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%d"))
        ax.set_xlabel("sequential publishers (one POST in flight each)")
        ax.grid(which="both", alpha=0.3)
    rate_ax.set_ylabel("acknowledged (durable) events/s")
    rate_ax.set_ylim(bottom=0)
    rate_ax.legend(fontsize=7)
    lat_ax.set_yscale("log")
    lat_ax.set_ylabel("publish latency, ms (log)\np50 solid, p99 dotted")
    title = args.title or ("durable publishing against sequential publishers (median per "
                           "count; bars: lowest to highest run; lines join measured counts)")
    save(fig, title, metas, args.out)


def self_test() -> None:
    """The parsers against inline samples of each input format."""
    log = """## 1. default flags (--fsync group)
== durable
  publishers | durable ev/s | publish p50 ms | p99 ms | server CPU us/ev | errors
           1 |         1622 |          0.399 |  4.130 |           230.49 | 0
          64 |        26326 |          2.156 |  6.942 |            31.34 | 0
## 2. --fsync never
           1 |         5003 |          0.115 |  0.966 |            86.32 | 0
## 3. fan-out 1 x 100
           9 |         9999 |          9.999 |  9.999 |                - | 0
"""
    rows = durable_rows_of_text(log)
    assert sorted(rows) == ["group", "never"], rows
    assert [(r["publishers"], r["events_per_sec"]) for r in rows["group"]] == [(1, 1622.0), (64, 26326.0)]
    assert rows["never"][0]["latency"] == {"p50_ms": 0.115, "p99_ms": 0.966}, rows
    legacy = {"latency": {"count": 1000, "p50_us": 5.0, "p99_us": 9.0, "p999_us": 20.0, "max_us": 30.0}}
    assert latency_points(legacy) == {0.5: 5.0, 0.99: 9.0, 0.999: 20.0, 1.0: 30.0}
    cdf = dict(legacy, latency_cdf_us=[[0.5, 5.0], [0.999, 20.0], [0.9999, 30.0], [1.0, 30.0]])
    assert latency_points(cdf) == {0.5: 5.0, 0.999: 20.0, 1.0: 30.0}, latency_points(cdf)
    assert latency_points({"latency": {"count": 0}}) == {}
    assert abs(nines(0.99, 0) - 2.0) < 1e-9 and abs(nines(1.0, 1000) - 3.0) < 1e-9
    assert provenance([None]).startswith("inputs without a meta object")
    line = provenance([{"commit": "abc", "kernel_release": "6.1", "loadavg_start": [1.0, 0, 0]}, None])
    assert line == "commit abc; kernel 6.1; load average at start 1.0-1.0; 1 of 2 inputs without meta", line
    print("plot.py self-test: ok")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    lat = sub.add_parser("latency", help="latency distributions, gateway vs nchan")
    lat.add_argument("dirs", nargs="+", metavar="DIR")
    lat.add_argument("--only", help="comma-separated scenarios")
    lat.add_argument("--out", default="latency.png")
    lat.add_argument("--title")
    dur = sub.add_parser("durable", help="durable publish rate against publishers")
    dur.add_argument("files", nargs="+", metavar="FILE[=LABEL]")
    dur.add_argument("--out", default="durable.png")
    dur.add_argument("--title")
    sub.add_parser("self-test", help="check the input parsers")
    args = p.parse_args()
    if args.cmd == "self-test":
        return self_test()
    ensure_matplotlib()
    {"latency": plot_latency, "durable": plot_durable}[args.cmd](args)


if __name__ == "__main__":
    main()
