"""Medians over rounds of the per-class resume figures in <dir>/<variant>-<round>.json."""
import glob, json, statistics, sys

d = sys.argv[1]
variants = sorted({f.split('/')[-1].rsplit('-', 1)[0] for f in glob.glob(f"{d}/*-[0-9].json")})
print("| variant | class | resumes (header) | resumes (/metrics) | to head p50 / p99 µs | to first event p50 / p99 / max µs |")
print("|---|---|---:|---:|---:|---:|")
for v in variants:
    runs = [json.load(open(f))["reports"][0] for f in sorted(glob.glob(f"{d}/{v}-[0-9].json"))]
    classes = []
    for r in runs:
        for c in r["resume_classes"]:
            if c["class"] not in classes:
                classes.append(c["class"])
    for cl in classes:
        rows = [next((c for c in r["resume_classes"] if c["class"] == cl), None) for r in runs]
        rows = [x for x in rows if x]
        med = lambda f: statistics.median(f(x) for x in rows)
        mkey = cl.replace("-", "_")
        metr = statistics.median(
            r["server_metrics"].get(f"gateway_resumes_total{{class={mkey}}}", 0) for r in runs)
        print(f"| {v} | {cl} | {med(lambda x: x['resumes']):.0f} | {metr:.0f} | "
              f"{med(lambda x: x['to_head']['p50_us']):.0f} / {med(lambda x: x['to_head']['p99_us']):.0f} | "
              f"{med(lambda x: x['to_first_event']['p50_us']):.0f} / {med(lambda x: x['to_first_event']['p99_us']):.0f} / "
              f"{med(lambda x: x['to_first_event']['max_us']):.0f} |")
print()
print("| variant | round | cuts | violations | gateway run-queue wait s | bench CPU s | aligned p50 / p99 µs (to first event) |")
print("|---|---|---:|---:|---:|---:|---:|")
for v in variants:
    for f in sorted(glob.glob(f"{d}/{v}-[0-9].json")):
        r = json.load(open(f))["reports"][0]
        a = next((c for c in r["resume_classes"] if c["class"] == "aligned"), None)
        al = f"{a['to_first_event']['p50_us']:.0f} / {a['to_first_event']['p99_us']:.0f}" if a else "—"
        print(f"| {v} | {f.rsplit('-',1)[1][0]} | {r['cuts']} | {r['violations']} | "
              f"{r['server']['runqueue_wait_secs']:.2f} | {r['bench_cpu_secs']:.2f} | {al} |")
