#!/usr/bin/env bash
# bench-durable.sh [GATEWAY_BIN]: the durability and kernel-floor figures of BENCHMARKS.md
# ("Durable by default"), in one run. Gateway on core 0 (one reactor), bench on core 1.
#  1. the gateway with its default flags (`--fsync group`): `bench durable` — the raw
#     fdatasync of its data filesystem (on core 0 and on core 1; after a 300 B overwrite, and
#     after a 300 B append into a preallocated file, the shape a log's sync has), then 1 and 64 sequential publishers (publish p50/p99,
#     durable events/s, server CPU per event);
#  1b. the same with `--fsync-scope filesystem`: a round of group commits naming several files
#     (the 8 shards' segments) is one syncfs (the data directory here is not a mount point of
#     its own, so `auto` would keep one fdatasync per file);
#  2. the same with `--fsync never` (the plain request round trip, for comparison);
#  3. fan-out 1 x 100 (300 B) with the default flags, publisher pipeline 1 (unbatched) and 16
#     (batched), and with `--fsync never`: server CPU per delivered event;
#  4. `bench floor`: one send() per subscriber per 300 B event to 100 loopback subscribers,
#     writer on core 0, reader on core 1 (the kernel's floor per delivery), twice: with a
#     busy-polling reader, unpaced (the cheapest floor), and like for like with the unbatched
#     `--fsync never` run of (3) — a reader that sleeps in epoll_wait as bench's subscribers do,
#     the writer paced to that run's events/s (so it too idles between events).
# Every wait is bounded; each gateway is stopped after its run and on any exit.
# Environment: SECS (seconds per step, default 5), PUBLISHERS (the publisher counts of (1) and
# (2), default 1,64; e.g. 1,2,4,8,16,32,64 for a curve), OUT (where the results are kept,
# default target/bench-durable/<UTC time>), BENCH_BIN (default target/release/bench),
# DURABLE_ONLY (set: stop after step 2).
# OUT keeps the log (run.log) and each bench run's JSON report with its meta object (commit,
# argv, CPUs, kernel, load average): durable-group.json, durable-never.json,
# fanout-fan-{g,n}{1,16}.json, floor-spin.json, floor-epoll.json. Plot the durable rate against
# publishers with: scripts/plot.py durable OUT/durable-group.json OUT/durable-never.json
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=$(realpath "${1:-target/release/gateway}")
BENCH=$(realpath "${BENCH_BIN:-target/release/bench}")
SECS=${SECS:-5}
PUBLISHERS=${PUBLISHERS:-1,64}
OUT=${OUT:-target/bench-durable/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
OUT=$(realpath "$OUT")
exec > >(tee "$OUT/run.log") 2>&1
WORK=$(mktemp -d /tmp/bench-durable.XXXXXX)
GW=""
RUN=""
# keep NAME: the bench flags that write its JSON report to OUT/NAME.json (none for a bench
# binary older than --json-file: then only run.log is kept).
if "$BENCH" durable --help | grep -q -- --json-file; then KEEP=1; else
  KEEP=0; echo "note: $BENCH has no --json-file; only $OUT/run.log is kept" >&2
fi
keep() { KEEP_ARGS=(); if [[ $KEEP == 1 ]]; then KEEP_ARGS=(--json-file "$OUT/$1.json"); fi; }
stop() {
  [[ -n $GW ]] || return 0
  kill -TERM "$GW" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$GW" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$GW" 2>/dev/null || true
  wait "$GW" 2>/dev/null || true
  GW=""
}
trap 'stop; rm -rf "$WORK"' EXIT
# start NAME FLAGS...: a fresh gateway on core 0; sets GW and ADDR.
start() {
  local name=$1; shift
  RUN=$name
  mkdir -p "$WORK/$name"
  taskset -c 0 "$BIN" --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 --connections-per-ip-max 0 --cores 1 --data-dir "$WORK/$name/data" "$@" \
    >"$WORK/$name/out" 2>"$WORK/$name/err" &
  GW=$!
  for _ in $(seq 100); do grep -q "listening on" "$WORK/$name/out" && break; sleep 0.1; done
  ADDR=$(grep -o "listening on .*" "$WORK/$name/out" | awk '{print $3}')
  [[ -n $ADDR ]] || { echo "gateway $name did not start" >&2; cat "$WORK/$name/err" >&2; exit 1; }
}
durable() {
  keep "durable-$RUN"
  taskset -c 1 "$BENCH" durable --publish-url "http://$ADDR/v1/streams/{stream}/events" \
    --target-pid "$GW" --secs-per-run "$SECS" --publishers "$PUBLISHERS" "${KEEP_ARGS[@]}" "$@"
}
fanout() { # fanout PIPELINE
  local u="http://$ADDR/v1/streams/{stream}"
  keep "fanout-$RUN"
  taskset -c 1 "$BENCH" fanout --streams 1 --subscribers-per-stream 100 --payload-bytes 300 \
    --publishers 1 --pipeline-depth "$1" --events-per-stream 100000000 --publish-secs-max "$SECS" \
    --publish-url "$u/events" --publish-batch-url "$u/events:batch" --subscribe-url "$u" \
    --publish-style gateway --id-style gateway --target-pid "$GW" "${KEEP_ARGS[@]}" \
    | tee "$WORK/fanout.txt" | grep -E "delivered events|server cpu s / 1M|gaps|violations" || true
}
echo "# bench-durable $(date -u +%FT%TZ) $(uname -r); load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "## 1. default flags (--fsync group)"
# The raw probe on core 0 (the gateway's: its syncs pay the same interrupt routing) and on core
# 1 (where the block device's interrupt lands on these VMs, the cheapest).
start group; durable --fsync-probe-dir "$WORK/group/data" --fsync-probe-cpus 0,1; stop
echo "## 1b. --fsync-scope filesystem (one syncfs per round of several files)"
start groupfs --fsync-scope filesystem; durable; stop
echo "## 2. --fsync never"
start never --fsync never; durable; stop
if [[ -n ${DURABLE_ONLY:-} ]]; then exit 0; fi
echo "## 3. fan-out 1 x 100"
EPS=0
for p in 1 16; do
  echo "### default flags, publisher pipeline $p"; start fan-g$p; fanout "$p"; stop
  echo "### --fsync never, publisher pipeline $p"; start fan-n$p --fsync never; fanout "$p"; stop
  if [[ $p == 1 ]]; then
    # delivered events/s of the unbatched run ÷ 100 subscribers = its published events/s
    EPS=$(grep -oP 'delivered events \(events/s\)\s+\d+ \(\K\d+' "$WORK/fanout.txt" || echo 0)
    EPS=$((EPS / 100))
  fi
done
echo "## 4. kernel floor"
keep floor-spin
taskset -c 0,1 "$BENCH" floor --subscribers 100 --payload-bytes 300 --secs "$SECS" --reader spin \
  "${KEEP_ARGS[@]}"
keep floor-epoll
taskset -c 0,1 "$BENCH" floor --subscribers 100 --payload-bytes 300 --secs "$SECS" --reader epoll \
  --events-per-sec "$EPS" "${KEEP_ARGS[@]}"
echo "== results in $OUT; plot: scripts/plot.py durable $OUT/durable-group.json $OUT/durable-never.json --out $OUT/durable.png"
