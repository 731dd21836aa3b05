#!/usr/bin/env bash
# Measures the MCP front's pass-through of a stdio flood (no assertions: a measurement).
# The awk upstream (gateway/tests/mcp_upstream.awk) writes COUNT progress notifications as fast
# as it can; one client reads the POST's SSE stream to its end (the result). Prints events/s
# and bytes/s as seen by the client, plus the time to resume the whole stream from its priming
# event (replay from the log). Usage: mcp-tests/measure-flood.sh [COUNT] (release build).
set -euo pipefail
cd "$(dirname "$0")/.."
COUNT=${1:-200000}
cargo build -p gateway --release --locked >&2
BIN=${CARGO_TARGET_DIR:-target}/release/gateway
WORK=$(mktemp -d)
trap 'kill $GW 2>/dev/null || true; wait $GW 2>/dev/null || true; rm -rf "$WORK"' EXIT
AWK="awk -f '$PWD/gateway/tests/mcp_upstream.awk'"
AWK_VERSION=$(awk -W version 2>&1 </dev/null || true)
[[ $AWK_VERSION == *mawk* ]] && AWK="awk -W interactive -f '$PWD/gateway/tests/mcp_upstream.awk'"
"$BIN" --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 --data-dir "$WORK/data" --cores 2 --fsync never --upstream-cmd "$AWK" >"$WORK/out" 2>"$WORK/err" &
GW=$!
for _ in $(seq 100); do grep -q listening "$WORK/out" && break; sleep 0.1; done
URL=http://$(sed -n 's/^listening on //p' "$WORK/out")/mcp
SID=$(curl -s -D - -o /dev/null -X POST "$URL" -H 'accept: text/event-stream' \
  -d '{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"m","version":"1"}}}' \
  | tr -d '\r' | sed -n 's/^mcp-session-id: //Ip')
body="{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"p\",\"arguments\":{\"count\":$COUNT},\"_meta\":{\"progressToken\":1}}}"
t0=$(date +%s.%N)
curl -s -X POST "$URL" -H 'accept: text/event-stream' -H "mcp-session-id: $SID" -d "$body" -o "$WORK/live.sse"
t1=$(date +%s.%N)
first=$(grep -m1 '^id: ' "$WORK/live.sse" | cut -c5-)
t2=$(date +%s.%N)
curl -s "$URL" -H 'accept: text/event-stream' -H "mcp-session-id: $SID" -H "last-event-id: $first" -o "$WORK/replay.sse"
t3=$(date +%s.%N)
ev_live=$(grep -c '"progress"' "$WORK/live.sse")
ev_replay=$(grep -c '"progress"' "$WORK/replay.sse")
bytes=$(stat -c %s "$WORK/live.sse")
awk -v n="$ev_live" -v r="$ev_replay" -v b="$bytes" -v a="$t0" -v z="$t1" -v c="$t2" -v d="$t3" 'BEGIN {
  printf "live:   %d progress events, %.0f events/s, %.1f MB/s (%.2f s, upstream-bound)\n", n, n/(z-a), b/(z-a)/1e6, z-a
  printf "replay: %d progress events from the log, %.0f events/s (%.2f s)\n", r, r/(d-c), d-c }'
