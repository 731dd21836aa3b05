#!/usr/bin/env bash
# bench-tls.sh: the gateway's fan-out over plaintext and over TLS (rustls, userspace), in one
# run on this machine, rounds alternating the order; prints per round and median delivered
# events/s and server CPU µs per delivered event, and TLS/plaintext (ratio of the medians, and
# the median of per-round ratios).
#
# Usage: bash scripts/bench-tls.sh [ROUNDS=3]
# Environment:
#   GATEWAY_BIN / BENCH_BIN  binaries (default target/release/{gateway,bench}; build them first:
#              cargo build --release -p gateway -p bench)
#   OUT        results dir (default /tmp/bench-tls-<UTC date>): one JSON, .err and .rc per run,
#              the gateways' logs, the certificate, run.log and table.md
#   SECS       publishing seconds per run (default 6; keep it <= 10)
#   SCENARIOS  space-separated subset of: batched unbatched batch100 (default: all three)
#   SERVER_CORE / BENCH_CORE  cores for the gateway and the bench (default 0 / 1)
#
# Scenarios: 1 stream × 100 subscribers, 300 B payloads, one publisher connection,
# --events-per-stream SECS*2,000,000 (a cap; --publish-secs-max SECS ends the run):
#   batched    --pipeline-depth 64 (one event per POST, 64 POSTs in flight: the fanout-1x100
#              scenario of BENCHMARKS.md and scripts/bench-ab.sh)
#   unbatched  --pipeline-depth 1 (one publish in flight)
#   batch100   --batch-events 100 --pipeline-depth 4 (BENCHMARKS.md's fanout-1x100-batch100)
# Every run: a fresh gateway and data dir, `taskset -c SERVER_CORE gateway --listen 127.0.0.1:0
# --cores 1 --fsync never --admin-listen 127.0.0.1:0 --connections-per-ip-max 0
# [--tls-cert-file c.pem --tls-key-file k.pem]`; the bench on BENCH_CORE with --target-pid
# (server CPU = utime+stime of the gateway from /proc over the measured window ÷ delivered
# events) and, over TLS, https:// URLs with --ca-file c.pem. The certificate is made at start:
#   openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout k.pem \
#     -out c.pem -days 2 -subj /CN=localhost -addext subjectAltName=IP:127.0.0.1
# Round r runs plain then tls when r is odd, tls then plain when r is even. Every wait is
# bounded; each gateway is stopped (SIGTERM, then SIGKILL after 5 s) after its run and on any
# exit. Exit status: 0 when every bench run exited 0, 1 otherwise (the table is printed anyway).
set -euo pipefail
# shellcheck source=SCRIPTDIR/lib/bench-common.sh
source "$(dirname "$0")/lib/bench-common.sh"
cd "$(dirname "$0")/.."
ROOT=$(pwd)

if [[ $# -gt 1 || ${1:-} == -h || ${1:-} == --help ]]; then
  sed -n '2,32p' "$0" >&2
  exit 2
fi
ROUNDS=${1:-3}
GATEWAY_BIN=$(realpath "${GATEWAY_BIN:-$ROOT/target/release/gateway}")
BENCH_BIN=$(realpath "${BENCH_BIN:-$ROOT/target/release/bench}")
SECS=${SECS:-6}
SERVER_CORE=${SERVER_CORE:-0}
BENCH_CORE=${BENCH_CORE:-1}
OUT=${OUT:-/tmp/bench-tls-$(date -u +%Y%m%dT%H%M%SZ)}
read -r -a SCENARIOS <<<"${SCENARIOS:-batched unbatched batch100}"

for b in "$GATEWAY_BIN" "$BENCH_BIN"; do
  [[ -x $b ]] || { echo "not an executable: $b (cargo build --release -p gateway -p bench)" >&2; exit 2; }
done
require_count ROUNDS "$ROUNDS" 50
require_count SECS "$SECS" 60
command -v openssl >/dev/null || { echo "openssl is needed for the certificate" >&2; exit 2; }

declare -A SCENARIO=(
  [batched]="--pipeline-depth 64"
  [unbatched]="--pipeline-depth 1"
  [batch100]="--batch-events 100 --pipeline-depth 4"
)
for name in "${SCENARIOS[@]}"; do
  [[ -n ${SCENARIO[$name]:-} ]] || { echo "unknown scenario: $name" >&2; exit 2; }
done

mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/bench-tls.XXXXXX)
GW_PID=""   # the running gateway, read by stop_gateway and run_bench (lib/bench-common.sh)

# On any exit: stop_gateway (SIGTERM, bounded wait, SIGKILL), then remove WORK.
trap stop_gateway_and_remove_work EXIT
trap 'exit 130' INT TERM

raise_nofile_limit

make_self_signed_cert "$WORK"
cp "$WORK/c.pem" "$OUT/cert.pem"

{
  echo "bench-tls $(date -u +%FT%TZ): rounds $ROUNDS, $SECS s per run, gateway core $SERVER_CORE, bench core $BENCH_CORE"
  echo "gateway $GATEWAY_BIN $(sha256sum "$GATEWAY_BIN" | cut -c1-16)"
  echo "bench   $BENCH_BIN $(sha256sum "$BENCH_BIN" | cut -c1-16)"
  echo "git     $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?') (working tree: $(git -C "$ROOT" status --porcelain 2>/dev/null | wc -l) changed paths)"
  echo "RLIMIT_NOFILE $(ulimit -n); load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$OUT/run.log"

EV=$((SECS * 2000000))
STATUS=0

# run_one SCENARIO SIDE(plain|tls) ROUND: one gateway process, one bench run.
run_one() {
  local name=$1 side=$2 round=$3
  local file data log addr scheme=http
  local tls_args=() ca_args=()
  file="$OUT/$name-$side.r$round"
  data="$WORK/data-$name-$side-$round"
  log="$file.gateway.log"
  if [[ $side == tls ]]; then
    tls_args=(--tls-cert-file "$WORK/c.pem" --tls-key-file "$WORK/k.pem")
    ca_args=(--ca-file "$WORK/c.pem")
    scheme=https
  fi
  taskset -c "$SERVER_CORE" "$GATEWAY_BIN" --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 \
    --connections-per-ip-max 0 --data-dir "$data" --cores 1 --fsync never "${tls_args[@]}" \
    >"$log" 2>&1 &
  GW_PID=$!
  addr=$(wait_for_listen_addr "$log" "$GW_PID") # bounded: 10 s
  if [[ -z $addr ]]; then
    gateway_did_not_listen "$name [$side] round $round" "$log" # stops it, STATUS=1
    echo 2 >"$file.rc"
    rm -rf "$data"
    return 0
  fi
  local u="$scheme://$addr/v1/streams/{stream}"
  # shellcheck disable=SC2086,SC2206 # the scenario string is a word list on purpose
  local args=(fanout --streams 1 --subscribers-per-stream 100 ${SCENARIO[$name]}
    --payload-bytes 300 --events-per-stream "$EV" --publish-secs-max "$SECS"
    --publish-url "$u/events" --publish-batch-url "$u/events:batch" --subscribe-url "$u"
    "${ca_args[@]}" --publish-style gateway --id-style gateway
    --target-pid "$GW_PID" --label "$name-$side" --json)
  # $file.json/.err/.rc; a nonzero exit sets STATUS=1
  run_bench "$name [$side] round $round" "$file" $((SECS * 3 + 90)) "${args[@]}"
  stop_gateway
  rm -rf "$data"
}

for round in $(seq 1 "$ROUNDS"); do
  if ((round % 2 == 1)); then order=(plain tls); else order=(tls plain); fi
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
            rep = json.load(f)["reports"][-1]
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return {}
    server = rep.get("server") or {}
    window = rep.get("window_secs") or 0
    bench = rep.get("bench_cpu_secs")
    return {
        "ev": rep.get("delivered_per_sec"),
        "cpu": server.get("cpu_us_per_delivered_event"),
        "wait": server.get("runqueue_wait_secs"),
        "bench": (bench / window) if bench is not None and window else None,
        "viol": rep.get("violations"),
    }

def fmt(v, digits, pct=False):
    if v is None:
        return "—"
    return f"{v:.0%}" if pct else f"{v:,.{digits}f}"

print(f"Rounds: {rounds} (odd rounds plain→tls, even rounds tls→plain). "
      "tls/plain = ratio of the medians; paired = median over rounds of that round's tls/plain "
      "(the two ran back to back). bench core = the load generator's CPU share of its core.")
print()
print("| scenario | metric | side | per round | median | tls/plain | paired |")
print("|---|---|---|---|---:|---:|---:|")
metrics = (("server CPU µs / delivered ev", "cpu", 3, False, True),
           ("delivered ev/s", "ev", 0, False, True),
           ("gateway run-queue wait s (noise)", "wait", 2, False, False),
           ("bench core busy", "bench", 0, True, False),
           ("violations", "viol", 0, False, False))
for name in scenarios:
    for mi, (label, key, digits, pct, ratio_it) in enumerate(metrics):
        per = {}
        med = {}
        for side in ("plain", "tls"):
            vals = [load(name, side, r).get(key) for r in range(1, rounds + 1)]
            per[side] = vals
            got = [v for v in vals if v is not None]
            med[side] = statistics.median(got) if got else None
            ratio = paired = ""
            if side == "tls" and ratio_it and med["plain"] and med["tls"] is not None:
                ratio = f"**{med['tls'] / med['plain']:.2f}**"
                pairs = [t / p for p, t in zip(per["plain"], vals) if p and t is not None]
                paired = f"{statistics.median(pairs):.2f}" if pairs else "—"
            print(f"| {name if side == 'plain' and mi == 0 else ''} | {label if side == 'plain' else ''} "
                  f"| {side} | {' / '.join(fmt(v, digits, pct) for v in vals)} "
                  f"| **{fmt(med[side], digits, pct)}** | {ratio} | {paired} |")
PY
echo
echo "results: $OUT"
exit "$STATUS"
