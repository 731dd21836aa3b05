#!/usr/bin/env bash
# bench-ab.sh: an old gateway binary against a new one, in one run on this machine, on two
# saturating scenarios from BENCHMARKS.md, with the order alternating per round; prints per
# round and median delivered events/s and server CPU µs per delivered event, new/old (ratio of
# the medians, and the median of per-round ratios) and the gateway's run-queue wait (the noise).
#
# Usage: bash scripts/bench-ab.sh OLD_GATEWAY_BIN NEW_GATEWAY_BIN [ROUNDS=5]
# Environment:
#   BENCH_BIN  the bench binary (default target/release/bench)
#   OUT        results dir (default /tmp/bench-ab-<UTC date>): one JSON, .err and .rc per run,
#              the gateways' logs, run.log and table.md
#   SECS       publishing seconds per run (default 6, as in BENCHMARKS.md; keep it <= 10)
#   SERVER_CORE / BENCH_CORE  cores for the gateway and the bench (default 0 / 1)
#   ONLY       scenarios to run, space-separated (default "fanout-1x100 streams-1000x1";
#              also fanout-1x100-depth1: the unbatched fan-out, one publish in flight, and
#              streams-100x1-depth1: 100 streams x 1 subscriber, 4 publishers, one in flight,
#              durable-64: 64 sequential publishers, durable (the gateway's default flags),
#              and fanout-1x100-depth16-durable: the fan-out, one publisher pipelining 16, durable)
#
# Scenarios (BENCHMARKS.md "Side by side with nginx + nchan" and "the subscriber receive path",
# 256 B payloads, bench defaults otherwise):
#   fanout-1x100    fanout --streams 1 --subscribers-per-stream 100 --pipeline-depth 64
#   streams-1000x1  fanout --streams 1000 --subscribers-per-stream 1 --publishers 4 --pipeline-depth 64
#   streams-100x1-depth1  fanout --streams 100 --subscribers-per-stream 1 --publishers 4 --pipeline-depth 1
# each with --events-per-stream SECS*2,000,000 (a cap; --publish-secs-max SECS ends the run);
#   durable-64      durable --publishers 64 --secs-per-run SECS, the gateway without --fsync never
#   fanout-1x100-depth16-durable  fanout --streams 1 --subscribers-per-stream 100 --pipeline-depth 16,
#                   the gateway without --fsync never
# Every gateway run: a fresh temp data dir, `taskset -c SERVER_CORE BIN --listen 127.0.0.1:0
# --cores 1 --fsync never --connections-max 200000`; the bench on BENCH_CORE with --target-pid.
# Round r runs old then new when r is odd, new then old when r is even (order effects cancel
# over an even number of rounds). Every wait is bounded; each gateway is stopped (SIGTERM, then
# SIGKILL after 5 s) after its run, and on any exit. Exit status: 0 when every bench run exited 0,
# 1 otherwise (the table is printed either way).
set -euo pipefail
# shellcheck source=SCRIPTDIR/lib/bench-common.sh
source "$(dirname "$0")/lib/bench-common.sh"
cd "$(dirname "$0")/.."
ROOT=$(pwd)

if [[ $# -lt 2 || $# -gt 3 || $1 == -h || $1 == --help ]]; then
  sed -n '2,25p' "$0" >&2
  exit 2
fi
OLD_BIN=$(realpath "$1")
NEW_BIN=$(realpath "$2")
ROUNDS=${3:-5}
BENCH_BIN=$(realpath "${BENCH_BIN:-$ROOT/target/release/bench}")
SECS=${SECS:-6}
SERVER_CORE=${SERVER_CORE:-0}
BENCH_CORE=${BENCH_CORE:-1}
OUT=${OUT:-/tmp/bench-ab-$(date -u +%Y%m%dT%H%M%SZ)}

for b in "$OLD_BIN" "$NEW_BIN" "$BENCH_BIN"; do
  [[ -x $b ]] || { echo "not an executable: $b" >&2; exit 2; }
done
require_count ROUNDS "$ROUNDS" 50
require_count SECS "$SECS" 60

mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/bench-ab.XXXXXX)
GW_PID=""   # the running gateway, read by stop_gateway and run_bench (lib/bench-common.sh)

# On any exit: stop_gateway (SIGTERM, bounded wait, SIGKILL), then remove WORK.
trap stop_gateway_and_remove_work EXIT
trap 'exit 130' INT TERM

# Subscribers, publishers and the gateway's sockets: raise the soft descriptor limit if allowed.
raise_nofile_limit

{
  echo "bench-ab $(date -u +%FT%TZ): rounds $ROUNDS, $SECS s per run, gateway core $SERVER_CORE, bench core $BENCH_CORE"
  echo "old   $OLD_BIN $(sha256sum "$OLD_BIN" | cut -c1-16)"
  echo "new   $NEW_BIN $(sha256sum "$NEW_BIN" | cut -c1-16)"
  echo "bench $BENCH_BIN $(sha256sum "$BENCH_BIN" | cut -c1-16)"
  echo "RLIMIT_NOFILE $(ulimit -n); load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$OUT/run.log"

EV=$((SECS * 2000000))
declare -A SCENARIO=(
  [fanout-1x100]="fanout --streams 1 --subscribers-per-stream 100 --pipeline-depth 64"
  [streams-1000x1]="fanout --streams 1000 --subscribers-per-stream 1 --publishers 4 --pipeline-depth 64"
  [fanout-1x100-depth1]="fanout --streams 1 --subscribers-per-stream 100 --pipeline-depth 1"
  [streams-100x1-depth1]="fanout --streams 100 --subscribers-per-stream 1 --publishers 4 --pipeline-depth 1"
  [durable-64]="durable --publishers 64"
  [fanout-1x100-depth16-durable]="fanout --streams 1 --subscribers-per-stream 100 --pipeline-depth 16"
)
# shellcheck disable=SC2206 # ONLY is a word list on purpose
SCENARIOS=(${ONLY:-fanout-1x100 streams-1000x1})
STATUS=0

# run_one SCENARIO SIDE(old|new) ROUND: one gateway process, one bench run.
run_one() {
  local name=$1 side=$2 round=$3
  local bin file data log addr
  if [[ $side == old ]]; then bin=$OLD_BIN; else bin=$NEW_BIN; fi
  file="$OUT/$name-$side.r$round"
  data="$WORK/data-$name-$side-$round"
  log="$file.gateway.log"
  local fsync=(--fsync never)
  if [[ $name == durable-* || $name == *-durable ]]; then fsync=(); fi
  taskset -c "$SERVER_CORE" "$bin" --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 --connections-per-ip-max 0 --data-dir "$data" --cores 1 \
    "${fsync[@]}" --connections-max 200000 >"$log" 2>&1 &
  GW_PID=$!
  addr=$(wait_for_listen_addr "$log" "$GW_PID") # bounded: 10 s
  if [[ -z $addr ]]; then
    gateway_did_not_listen "$name [$side] round $round" "$log" # stops it, STATUS=1
    echo 2 >"$file.rc"
    rm -rf "$data"
    return 0
  fi
  local u="http://$addr/v1/streams/{stream}"
  # shellcheck disable=SC2086,SC2206 # the scenario string is a word list on purpose
  local args=(${SCENARIO[$name]} --payload-bytes 256 --events-per-stream "$EV"
    --publish-secs-max "$SECS" --publish-url "$u/events" --publish-batch-url "$u/events:batch"
    --subscribe-url "$u" --publish-style gateway --id-style gateway
    --target-pid "$GW_PID" --label "$side" --json)
  if [[ $name == durable-* ]]; then
    # shellcheck disable=SC2086,SC2206
    args=(${SCENARIO[$name]} --secs-per-run "$SECS" --publish-url "$u/events"
      --target-pid "$GW_PID" --json)
  fi
  # $file.json/.err/.rc; a nonzero exit sets STATUS=1
  run_bench "$name [$side] round $round" "$file" $((SECS * 3 + 90)) "${args[@]}"
  stop_gateway
  rm -rf "$data"
}

for round in $(seq 1 "$ROUNDS"); do
  if ((round % 2 == 1)); then order=(old new); else order=(new old); fi
  for name in "${SCENARIOS[@]}"; do
    for side in "${order[@]}"; do
      run_one "$name" "$side" "$round"
    done
  done
done
run_log "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

echo
python3 - "$OUT" "$ROUNDS" "${SCENARIOS[@]}" <<'PY' | tee "$OUT/table.md"
import json, statistics, sys

out, rounds, scenarios = sys.argv[1], int(sys.argv[2]), sys.argv[3:]

def load(name, side, r):
    try:
        with open(f"{out}/{name}-{side}.r{r}.json") as f:
            doc = json.load(f)
        if "rows" in doc:  # bench durable: acknowledged events/s, publish latency
            row = doc["rows"][-1]
            lat = row.get("latency") or {}
            ms = lambda k: None if lat.get(k) is None else lat[k] * 1000
            return (row["events_per_sec"], row.get("server_cpu_us_per_event"), None,
                    ms("p50_ms"), ms("p99_ms"), None)
        rep = doc["reports"][-1]
        server = rep.get("server") or {}
        lat = rep.get("latency") or {}
        return (rep["delivered_per_sec"], server.get("cpu_us_per_delivered_event"),
                server.get("runqueue_wait_secs"), lat.get("p50_us"), lat.get("p99_us"),
                lat.get("p999_us"))
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None, None, None, None, None, None

def fmt(v, digits):
    return "—" if v is None else f"{v:,.{digits}f}"

print(f"Rounds: {rounds} (odd rounds old→new, even rounds new→old). "
      "Spread = (max − min) / median over the rounds. new/old = ratio of the medians; "
      "paired = median over rounds of that round's new/old (the two ran back to back). "
      "durable-*: ev/s are acknowledged (durable) publishes, latency is publish -> 201.")
print()
print("| scenario | metric | binary | per round | median | spread | new/old | paired |")
print("|---|---|---|---|---:|---:|---:|---:|")
for name in scenarios:
    # The run-queue wait (time the gateway's threads were runnable but not running, summed over
    # threads) is the noise gauge: other load on the gateway's core shows up there first.
    # Publish -> delivery latency as the bench measures it (closed loop: its tail depends on
    # the rate, which the first row gives).
    for metric, idx, digits in (("delivered ev/s", 0, 0), ("server CPU µs / delivered ev", 1, 2),
                                ("gateway run-queue wait s (noise)", 2, 2),
                                ("latency p50 µs", 3, 0), ("latency p99 µs", 4, 0),
                                ("latency p99.9 µs", 5, 0)):
        med, per_round = {}, {}
        for side in ("old", "new"):
            vals = [load(name, side, r)[idx] for r in range(1, rounds + 1)]
            per_round[side] = vals
            got = [v for v in vals if v is not None]
            med[side] = statistics.median(got) if got else None
            spread = ((max(got) - min(got)) / med[side]) if len(got) > 1 and med[side] else None
            ratio = paired = ""
            if side == "new" and idx != 2 and med["old"] and med["new"] is not None:
                ratio = f"**{med['new'] / med['old']:.3f}**"
                pairs = [n / o for o, n in zip(per_round["old"], vals) if o and n is not None]
                paired = f"{statistics.median(pairs):.3f}" if pairs else "—"
            print(f"| {name if side == 'old' and idx == 0 else ''} | {metric if side == 'old' else ''} "
                  f"| {side} | {' / '.join(fmt(v, digits) for v in vals)} | **{fmt(med[side], digits)}** "
                  f"| {'—' if spread is None else f'{spread:.0%}'} | {ratio} | {paired} |")
PY
echo
echo "results: $OUT"
exit "$STATUS"
