#!/bin/bash
# Aligned-resume latency (BENCHMARKS.md, "Aligned resume latency"): 3 rounds of 3 resume-storm
# variants against a fresh gateway each (core 0, --cores 1, --fsync never), bench on core 1.
# usage: run.sh <dir with release gateway and bench> <output dir> [secs] [light]
# "light": 5 subscribers, 1,000 events/s, 50 cuts/s, and only the boundary/eagain variants.
set -u
BIN=$1; OUT=$2; SECS=${3:-10}; LIGHT=${4:-}
mkdir -p "$OUT"
COMMON=(--streams 1 --subscribers-per-stream 20 --events-per-stream 10000000
  --rate-events-per-sec 2000 --cuts-per-sec 100 --publish-secs-max "$SECS")
VARIANTS="boundary eagain random"
if [ "$LIGHT" = light ]; then
  COMMON=(--streams 1 --subscribers-per-stream 5 --events-per-stream 10000000
    --rate-events-per-sec 1000 --cuts-per-sec 50 --publish-secs-max "$SECS")
  VARIANTS="boundary eagain"
fi
variant_args() {
  case $1 in
    boundary) echo --cut-at-boundary --cut-pause-ms 20 --subscriber-rcvbuf-bytes 4096 ;;
    eagain) echo --cut-at-eagain --cut-pause-ms 20 --subscriber-rcvbuf-bytes 4096 ;;
    random) echo ;;
  esac
}
for round in $(seq 1 ${ROUNDS:-3}); do
  for v in $VARIANTS; do
    D=$(mktemp -d)
    PORT=$((18000 + RANDOM % 1000))
    taskset -c 0 "$BIN/gateway" --listen 127.0.0.1:$PORT --data-dir "$D/data" --cores 1 \
      --fsync never ${GW_EXTRA:-} >"$D/gw.log" 2>&1 &
    GW=$!
    for _ in $(seq 1 100); do grep -q listening "$D/gw.log" && break; sleep 0.1; done
    echo "round $round $v: load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/run.log"
    # shellcheck disable=SC2046
    taskset -c 1 "$BIN/bench" resume-storm "${COMMON[@]}" $(variant_args $v) \
      --publish-url "http://127.0.0.1:$PORT/v1/streams/{stream}/events" \
      --subscribe-url "http://127.0.0.1:$PORT/v1/streams/{stream}" \
      --publish-style gateway --id-style gateway --target-pid $GW --label "$v" \
      --metrics-url "http://127.0.0.1:$PORT/metrics" --json >"$OUT/$v-$round.json" 2>>"$OUT/run.log"
    echo "  bench exit $?" | tee -a "$OUT/run.log"
    kill $GW; wait $GW 2>/dev/null
    rm -rf "$D"
  done
done
