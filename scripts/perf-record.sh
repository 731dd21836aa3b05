#!/usr/bin/env bash
# perf-record.sh GATEWAY_BIN NAME [SECS=7]: one streams-1000x1 run (1,000 streams x 1 subscriber,
# 4 publishers pipelined 64, 256 B payloads) with the gateway pinned to core 0 and bench to core
# 1, while `perf record -e cpu-clock -g` samples the gateway for 4 s into /tmp/NAME.data; prints
# bench's CPU-per-event lines. Read with: perf report -i /tmp/NAME.data --no-children --sort symbol
# Needs `perf` (Debian linux-perf). Bounded: bench stops after SECS, the gateway is killed after.
set -euo pipefail
BIN=${1:?gateway binary}; NAME=${2:?output name}; SECS=${3:-7}
BENCH=${BENCH_BIN:-target/release/bench}
D=$(mktemp -d)
trap 'kill "$GP" 2>/dev/null || true; rm -rf "$D"' EXIT
taskset -c 0 "$BIN" --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 --connections-per-ip-max 0 --cores 1 --fsync never --connections-max 200000 \
  --data-dir "$D/data" >"$D/out" 2>"$D/err" &
GP=$!
for _ in $(seq 100); do grep -q "listening on" "$D/out" && break; sleep 0.1; done
ADDR=$(grep -o "listening on .*" "$D/out" | awk '{print $3}')
U="http://$ADDR/v1/streams/{stream}"
taskset -c 1 "$BENCH" fanout --streams 1000 --subscribers-per-stream 1 --publishers 4 \
  --pipeline-depth 64 --payload-bytes 256 --events-per-stream 12000000 --publish-secs-max "$SECS" \
  --publish-url "$U/events" --publish-batch-url "$U/events:batch" --subscribe-url "$U" \
  --publish-style gateway --id-style gateway --target-pid "$GP" >"$D/bench.txt" 2>&1 &
BP=$!
sleep 2
perf record -e cpu-clock -F 2000 -g -p "$GP" -o "/tmp/$NAME.data" -- sleep 4 >/dev/null 2>&1
wait "$BP"
grep -iE "server cpu|delivered" "$D/bench.txt" || true
