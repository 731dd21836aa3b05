#!/usr/bin/env bash
# durable-bound.sh [GATEWAY_BIN]: what bounds 64 sequential durable publishers on one core
# (issue 26), in one run. Gateway on core 0 (`--cores 1`), bench on core 1, as in
# bench-durable.sh:
#  1. 64 publishers against 1, 2, 4 and 8 shards (`--shards-on-create`; 8 is the default):
#     durable events/s, server CPU per event, and the fdatasyncs the run made;
#  2. with the default 8 shards, where the gateway's CPU goes while 64 publishers run, by
#     thread kind (the reactor `core-0`, io_uring's workers `iou-wrk-*` that run the
#     fdatasyncs, the log's helper threads), from /proc's per-thread CPU ticks over 5 s;
#  3. with `--fsync-scope filesystem`, where the `log-syncfs` thread waits: its kernel stack
#     (/proc/<tid>/stack) sampled 1,500 times while 64 publishers run, top frames counted.
# Every wait is bounded; each gateway is stopped after its step and on any exit. Environment:
# SECS (seconds per bench run, default 5), BENCH_BIN (default target/release/bench).
set -euo pipefail
source "$(dirname "$0")/lib/bench-common.sh"
cd "$(dirname "$0")/.."
BIN=$(realpath "${1:-target/release/gateway}")
BENCH=$(realpath "${BENCH_BIN:-target/release/bench}")
SECS=${SECS:-5}
WORK=$(mktemp -d /tmp/durable-bound.XXXXXX)
OUT=$WORK # run.log (bench-common's notes) stays with the work files
GW_PID=""
trap stop_gateway_and_remove_work EXIT
# start NAME FLAGS...: a fresh gateway on core 0; sets GW_PID, ADDR and ADMIN.
start() {
  local name=$1; shift
  mkdir -p "$WORK/$name"
  taskset -c 0 "$BIN" --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 --connections-per-ip-max 0 \
    --cores 1 --data-dir "$WORK/$name/data" "$@" >"$WORK/$name/out" 2>"$WORK/$name/err" &
  GW_PID=$!
  for _ in $(seq 100); do grep -qs "admin listener on" "$WORK/$name/out" && break; sleep 0.1; done
  ADDR=$(grep -o "listening on .*" "$WORK/$name/out" | awk '{print $3}')
  ADMIN=$(grep -o "admin listener on .*" "$WORK/$name/out" | awk '{print $4}')
  [[ -n $ADDR && -n $ADMIN ]] || { echo "gateway $name did not start" >&2; cat "$WORK/$name/err" >&2; exit 1; }
}
durable() { # durable SECS: 64 publishers; prints the bench table's row
  taskset -c 1 "$BENCH" durable --publish-url "http://$ADDR/v1/streams/{stream}/events" \
    --target-pid "$GW_PID" --secs-per-run "$1" --publishers 64 | grep -E '^ +64 \|'
}
metric() { curl -s "http://$ADMIN/metrics" | awk -v n="$1" '$1 ~ "^"n"(\\{|$)" {s += $2} END {print s + 0}'; }
# CPU ticks of the gateway's threads, summed by kind (the name without a trailing -<n>).
ticks() {
  for t in /proc/"$GW_PID"/task/*; do
    printf '%s %s\n' "$(sed 's/-[0-9]*$//' "$t/comm")" "$(awk '{print $14 + $15}' "$t/stat")"
  done | awk '{a[$1] += $2} END {for (k in a) print k, a[k]}' | sort
}
echo "# durable-bound $(date -u +%FT%TZ) $(uname -r); load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "## 1. 64 publishers against the shard count"
echo "shards | durable ev/s | publish p50 ms | p99 ms | server CPU us/ev | errors | fdatasyncs"
for shards in 1 2 4 8; do
  start "shards$shards" --shards-on-create "$shards"
  row=$(durable "$SECS")
  echo "$shards |$(cut -d'|' -f2- <<<"$row") | $(metric gateway_log_fsyncs_total)"
  stop_gateway
done
echo "## 2. where the CPU goes, 8 shards, 64 publishers (CPUs busy over 5 s, by thread kind)"
start split
durable $((SECS + 6)) >"$WORK/split.txt" &
BENCH_PID=$!
sleep 3
ticks >"$WORK/t1"; sleep 5; ticks >"$WORK/t2"
wait "$BENCH_PID"
join "$WORK/t1" "$WORK/t2" | awk '{printf "%-12s %.2f CPU\n", $1, ($3 - $2) / 500}'
echo "(the run: $(cat "$WORK/split.txt"))"
stop_gateway
echo "## 3. where a syncfs waits (--fsync-scope filesystem, 64 publishers; top 3 frames)"
start syncfs --fsync-scope filesystem
durable $((SECS + 6)) >"$WORK/syncfs.txt" &
BENCH_PID=$!
sleep 3
TID=""
for t in /proc/"$GW_PID"/task/*; do [[ $(cat "$t/comm") == log-syncfs ]] && TID=${t##*/}; done
if [[ -n $TID ]]; then
  for _ in $(seq 1500); do
    head -3 "/proc/$GW_PID/task/$TID/stack" 2>/dev/null | awk '{print $2}' | sed 's/+.*//' | paste -sd';'
  done | sort | uniq -c | sort -rn | head -8
else
  echo "no log-syncfs thread (no round named several files)"
fi
wait "$BENCH_PID"
echo "(the run: $(cat "$WORK/syncfs.txt"))"
stop_gateway
