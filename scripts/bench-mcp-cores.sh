#!/usr/bin/env bash
# bench-mcp-cores.sh [GATEWAY_BIN]: MCP calls per second with the gateway on 1 core and on 2
# (issue 26, "MCP on every core"), ROUNDS rounds alternating 1 and 2, each on a fresh data
# directory with the default flags (`--fsync group`).
#  - 1 core: `--cores 1`, the gateway pinned to CPU 1;
#  - 2 cores: `--cores 2`, its reactors pinned to CPUs 0 and 1 (the gateway pins them);
#  - the load: `bench mcp`, SESSIONS sessions (a thread each) making CALLS calls each of
#    PROGRESS progress notifications, no pacing, no cuts; the upstream is the end-to-end tests'
#    awk server (`gateway/tests/mcp_upstream.awk`, one process per session). Bench and the
#    upstreams are not pinned: on a 2-CPU machine they share the CPUs with the gateway, which
#    bounds what a second reactor can add (the script prints each run's CPU use to show it).
# For each run: calls/s (bench), the gateway's CPU seconds per 1,000 calls, and each reactor
# thread's share of the gateway's CPU (`core-N` threads) — with 2 cores both reactors serve
# MCP sessions.
# Environment: ROUNDS (default 3), SESSIONS (256), CALLS (60), PROGRESS (10), OUT (where the
# results are kept, default target/bench-mcp-cores/<UTC time>), BENCH_BIN.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=$(realpath "${1:-target/release/gateway}")
BENCH=$(realpath "${BENCH_BIN:-target/release/bench}")
ROUNDS=${ROUNDS:-3}
SESSIONS=${SESSIONS:-256}
CALLS=${CALLS:-60}
PROGRESS=${PROGRESS:-10}
OUT=${OUT:-target/bench-mcp-cores/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
OUT=$(realpath "$OUT")
exec > >(tee "$OUT/run.log") 2>&1
WORK=$(mktemp -d /tmp/bench-mcp-cores.XXXXXX)
GW=""
stop() {
  if [ -n "$GW" ] && kill -0 "$GW" 2>/dev/null; then
    kill -TERM "$GW" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$GW" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$GW" 2>/dev/null || true
  fi
  GW=""
}
trap 'stop; rm -rf "$WORK"' EXIT
MAWK=""
if awk -W version 2>&1 | grep -q mawk; then MAWK="-W interactive"; fi
cat > "$WORK/upstream.sh" <<EOF
#!/bin/sh
exec awk $MAWK -f $PWD/gateway/tests/mcp_upstream.awk
EOF
chmod +x "$WORK/upstream.sh"

# cpu_secs PID: the process's user + system CPU seconds so far.
cpu_secs() { awk -v hz="$(getconf CLK_TCK)" '{print ($14 + $15) / hz}' "/proc/$1/stat"; }
# thread_cpu PID: "name=seconds" for each thread of the process.
thread_cpu() {
  for t in /proc/"$1"/task/*; do
    awk -v hz="$(getconf CLK_TCK)" -v name="$(cat "$t/comm")" \
      '{printf "%s=%.2f ", name, ($14 + $15) / hz}' "$t/stat"
  done
  echo
}

run() { # run ROUND CORES
  local round=$1 cores=$2 port cpus
  port=$((18200 + round * 10 + cores))
  if [ "$cores" = 1 ]; then cpus=1; else cpus=0,1; fi
  rm -rf "$WORK/data"
  taskset -c "$cpus" "$BIN" --listen "127.0.0.1:$port" --data-dir "$WORK/data" \
    --cores "$cores" --upstream-cmd "$WORK/upstream.sh" --mcp-sessions-max 4096 \
    --log-level warn > "$WORK/gw.log" 2>&1 &
  GW=$!
  for _ in $(seq 100); do
    grep -q "listening on" "$WORK/gw.log" 2>/dev/null && break
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
    sleep 0.1
  done
  local before after
  before=$(cpu_secs "$GW")
  "$BENCH" mcp --mcp-url "http://127.0.0.1:$port/mcp" --sessions "$SESSIONS" \
    --calls-per-session "$CALLS" --progress-count "$PROGRESS" --interval-ms 0 \
    --cuts-per-call 0 --label "cores-$cores-r$round" > "$OUT/mcp-$cores-r$round.txt"
  after=$(cpu_secs "$GW")
  local rate
  rate=$(grep "calls completed" "$OUT/mcp-$cores-r$round.txt" | sed 's/.*(\([0-9]*\)).*/\1/')
  local calls=$((SESSIONS * CALLS))
  printf 'round %s cores %s: %s calls/s, gateway CPU %.2f s per 1000 calls; threads: %s\n' \
    "$round" "$cores" "$rate" "$(echo "($after - $before) * 1000 / $calls" | bc -l)" \
    "$(thread_cpu "$GW" | tr '\n' ' ')"
  grep -q "VIOLATIONS *0$" "$OUT/mcp-$cores-r$round.txt" || {
    echo "violations in round $round, $cores cores:"; cat "$OUT/mcp-$cores-r$round.txt"; exit 1; }
  echo "$cores $rate" >> "$OUT/rates"
  stop
}

echo "bench-mcp-cores: $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(nproc) CPUs," \
  "load $(cut -d' ' -f1-3 /proc/loadavg); $SESSIONS sessions x $CALLS calls x $PROGRESS progress"
for r in $(seq "$ROUNDS"); do
  run "$r" 1
  run "$r" 2
done
python3 - "$OUT/rates" <<'EOF'
import statistics, sys
rates = {}
for line in open(sys.argv[1]):
    c, r = line.split()
    rates.setdefault(c, []).append(float(r))
m1, m2 = statistics.median(rates["1"]), statistics.median(rates["2"])
print(f"median calls/s: 1 core {m1:.0f}, 2 cores {m2:.0f}; ratio {m2 / m1:.2f}x")
EOF
