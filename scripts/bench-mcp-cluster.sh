#!/usr/bin/env bash
# bench-mcp-cluster.sh: how fast one MCP stream flows through the gateway, single-node against
# cluster mode (every MCP record through a 3-node JetStream cluster, R3, sync_interval: always),
# with --cluster-mcp-inflight-max 1 and the default, in one run on this machine.
#
# Usage: bash scripts/bench-mcp-cluster.sh [COUNT=1000] [REPS=5]
# Environment: GATEWAY_BIN (default target/release/gateway; cargo build --release -p gateway),
#   NATS_SERVER (default: nats-server on PATH; bash scripts/setup-cluster.sh installs it),
#   OUT (default /tmp/bench-mcp-cluster-<UTC date>), SERVER_CORE / CLIENT_CORE (default 0 / 1).
# Each case: a fresh gateway (--cores 1, pinned to SERVER_CORE) with the stdio fixture upstream
# gateway/tests/mcp_upstream.awk; scripts/mcp-stream-rate.py (pinned to CLIENT_CORE) opens one
# session and runs REPS tools/call of COUNT progress notifications each, no interval. The three
# NATS servers run unpinned (they share both cores with the rest). Prints a table: median time
# to the first progress notification, median records/s of one stream; then JetStream alone
# with the same in-flight window (the floor). Every wait is bounded; every process is stopped
# on exit.
set -euo pipefail
# shellcheck source=SCRIPTDIR/lib/bench-common.sh
source "$(dirname "$0")/lib/bench-common.sh"
cd "$(dirname "$0")/.."
ROOT=$(pwd)
COUNT=${1:-1000}
REPS=${2:-5}
GATEWAY_BIN=$(realpath "${GATEWAY_BIN:-$ROOT/target/release/gateway}")
NATS_SERVER=${NATS_SERVER:-$(command -v nats-server || true)}
OUT=${OUT:-/tmp/bench-mcp-cluster-$(date -u +%Y%m%dT%H%M%SZ)}
SERVER_CORE=${SERVER_CORE:-0}
CLIENT_CORE=${CLIENT_CORE:-1}
[[ -x $GATEWAY_BIN ]] || { echo "not an executable: $GATEWAY_BIN" >&2; exit 2; }
[[ -n $NATS_SERVER ]] || { echo "nats-server not found (bash scripts/setup-cluster.sh)" >&2; exit 2; }
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/bench-mcp-cluster.XXXXXX)
PIDS=()
trap kill_pids_and_remove_work EXIT


# Three NATS servers, one JetStream cluster (unpinned).
start_nats_cluster ""
URLS=()
for u in "${NATS_URLS[@]}"; do URLS+=(--nats-url "$u"); done

UPSTREAM="awk -f $ROOT/gateway/tests/mcp_upstream.awk"
if awk -W version 2>&1 | grep -q mawk; then UPSTREAM="awk -W interactive -f $ROOT/gateway/tests/mcp_upstream.awk"; fi

# run_case NAME FLAGS...: one gateway, one probe; appends a table row.
run_case() {
  local name=$1; shift
  local log="$OUT/$name.gateway.log" addr="" pid
  taskset -c "$SERVER_CORE" "$GATEWAY_BIN" --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 \
    --data-dir "$WORK/data-$name" --cores 1 --upstream-cmd "$UPSTREAM" "$@" >"$log" 2>&1 &
  pid=$!
  PIDS+=("$pid")
  for _ in $(seq 1 1200); do # bounded: 120 s (a JetStream cluster electing its leaders)
    addr=$(sed -n 's/^listening on \([0-9.]*:[0-9]*\).*/\1/p' "$log" | head -1)
    [[ -n $addr ]] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  [[ -n $addr ]] || { echo "$name: the gateway did not start; see $log" >&2; exit 1; }
  local r
  r=$(timeout 300 taskset -c "$CLIENT_CORE" python3 scripts/mcp-stream-rate.py "${addr%:*}" "${addr#*:}" "$COUNT" "$REPS")
  read -r first rate <<<"$r"
  printf '| %s | %s ms | %s |\n' "$name" "$first" "$rate" | tee -a "$OUT/table.md"
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
}

{
  echo "bench-mcp-cluster $(date -u +%FT%TZ): COUNT $COUNT, REPS $REPS, gateway core $SERVER_CORE, client core $CLIENT_CORE"
  echo
  echo "| case | first progress p50 | records/s of one stream p50 |"
  echo "|---|---:|---:|"
} | tee "$OUT/table.md"
run_case single-node
run_case cluster-inflight-1 "${URLS[@]}" --nats-connect-timeout-secs 120 --cluster-mcp-inflight-max 1
run_case cluster-inflight-64 "${URLS[@]}" --nats-connect-timeout-secs 120

# JetStream alone, the same work's floor: one subject (R3), COUNT messages of 150 B published
# in order on one connection with at most 64 acknowledgements outstanding (the gateway's
# default --cluster-mcp-inflight-max), each with its own Nats-Msg-Id as the gateway sends;
# REPS rounds, the median rate. nats-py, pinned to CLIENT_CORE.
python3 -c 'import nats' 2>/dev/null \
  || python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore nats-py >&2
floor=$(timeout 300 taskset -c "$CLIENT_CORE" python3 - "${NATS_URLS[0]}" "$COUNT" "$REPS" <<'PY'
import asyncio, sys, time
import nats

async def main(url, count, reps):
    nc = await nats.connect(url)
    js = nc.jetstream()
    try:
        await js.delete_stream("MCPFLOOR")
    except Exception:
        pass
    await js.add_stream(name="MCPFLOOR", subjects=["mcpfloor"], num_replicas=3)
    payload, rates = b"x" * 150, []
    for r in range(reps):
        window = asyncio.Semaphore(64)
        async def one(i):
            try:
                await js.publish("mcpfloor", payload, headers={"Nats-Msg-Id": f"{r}-{i}"})
            finally:
                window.release()
        t0, tasks = time.perf_counter(), []
        for i in range(count):
            await window.acquire()
            tasks.append(asyncio.create_task(one(i)))  # started in order: sent in order
        await asyncio.gather(*tasks)
        rates.append(count / (time.perf_counter() - t0))
    rates.sort()
    print(f"{rates[len(rates) // 2]:.0f}")
    await nc.close()

asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
PY
) || floor="failed"
printf '| %s | %s | %s |\n' "JetStream alone: one subject, in order, 64 in flight" "—" "$floor" | tee -a "$OUT/table.md"
echo "results: $OUT"
