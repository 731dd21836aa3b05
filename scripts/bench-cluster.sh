#!/usr/bin/env bash
# bench-cluster.sh: cluster mode (--nats-url) through HAProxy with 1, 2 and 3 gateway nodes, in
# one run, beside a single-node gateway (durable default, no NATS) through the same HAProxy:
#   - publish latency: `bench durable` (1 sequential publisher, then 64; one POST in flight each)
#     -> p50/p99 and acknowledged events/s (cluster: JetStream R3 quorum ack + local apply);
#   - fan-out: `bench fanout` 1 stream x 100 subscribers, 300 B, --pipeline-depth 16, SECS s ->
#     delivered events/s and the gateways' CPU (utime+stime of every gateway from /proc over the
#     bench run) per delivered event; with N nodes each node delivers about 1/N of the events
#     and applies all of them;
#   - catch-up: a fresh gateway on an empty data directory; events applied per second until it
#     holds everything JetStream holds (gateway_cluster_applied_total vs /jsz).
# Usage: bash scripts/bench-cluster.sh
# Environment: GATEWAY_BIN / BENCH_BIN (default target/release/*), NATS_SERVER / HAPROXY (default
# from PATH; scripts/setup-cluster.sh installs them), SECS (default 5), OUT (results dir).
# Pinning (2 cores here): NATS servers, gateways and HAProxy on core 0, the bench on core 1.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
GATEWAY_BIN=$(realpath "${GATEWAY_BIN:-$ROOT/target/release/gateway}")
BENCH_BIN=$(realpath "${BENCH_BIN:-$ROOT/target/release/bench}")
NATS_SERVER=${NATS_SERVER:-$(command -v nats-server || true)}
HAPROXY=${HAPROXY:-$(command -v haproxy || true)}
SECS=${SECS:-5}
OUT=${OUT:-/tmp/bench-cluster-$(date -u +%Y%m%dT%H%M%SZ)}
[[ -x $GATEWAY_BIN && -x $BENCH_BIN ]] || { echo "build first: cargo build --release -p gateway -p bench" >&2; exit 2; }
[[ -n $NATS_SERVER && -n $HAPROXY ]] || { echo "run scripts/setup-cluster.sh first" >&2; exit 2; }
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/bench-cluster.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
log() { echo "$*" | tee -a "$OUT/run.log"; }

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
ticks() { local t=0 p; for p in "$@"; do t=$((t + $(awk '{print $14+$15}' "/proc/$p/stat"))); done; echo $t; }

log "bench-cluster $(date -u +%FT%TZ): git $(git rev-parse --short HEAD), $SECS s per fan-out run, load $(cut -d' ' -f1-3 /proc/loadavg)"
log "pinning: nats-server x3, gateways, haproxy on core 0; bench on core 1"

# --- NATS: 3 nodes, JetStream R3, sync_interval always ---
NATS_URLS=() ; MON=()
routes=(); rports=()
for i in 0 1 2; do rports+=("$(free_port)"); done
for i in 0 1 2; do routes+=("nats-route://127.0.0.1:${rports[$i]}"); done
for i in 0 1 2; do
  cp=$(free_port); mp=$(free_port)
  NATS_URLS+=("nats://127.0.0.1:$cp"); MON+=("$mp")
  cat >"$WORK/n$i.conf" <<CONF
server_name: n$i
listen: 127.0.0.1:$cp
http: 127.0.0.1:$mp
jetstream { store_dir: "$WORK/js$i", sync_interval: always }
cluster { name: gw, listen: 127.0.0.1:${rports[$i]}, routes: [$(IFS=,; echo "${routes[*]}")] }
CONF
  taskset -c 0 "$NATS_SERVER" -c "$WORK/n$i.conf" >"$OUT/nats$i.log" 2>&1 &
  PIDS+=($!)
done

# start_gateway NAME EXTRA...: prints "pid addr admin"
start_gateway() {
  local name=$1; shift
  local glog="$OUT/$name.log"
  taskset -c 0 "$GATEWAY_BIN" --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 --cores 1 \
    --connections-per-ip-max 0 --data-dir "$WORK/$name" "$@" >"$glog" 2>&1 &
  local pid=$! addr="" admin=""
  for _ in $(seq 1 600); do # bounded: 60 s (NATS elects its leaders first)
    addr=$(sed -n 's/^listening on \(.*\)/\1/p' "$glog" | head -1)
    admin=$(sed -n 's/^admin listener on \(.*\)/\1/p' "$glog" | head -1)
    [[ -n $addr && -n $admin ]] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  [[ -n $addr ]] || { echo "gateway $name did not start:" >&2; tail -5 "$glog" >&2; exit 1; }
  echo "$pid $addr $admin"
}
nats_args() { local u; for u in "${NATS_URLS[@]}"; do printf -- '--nats-url %s ' "$u"; done; }

HA_PID=""
start_haproxy() { # backends...
  local port; port=$(free_port)
  {
    printf 'global\n  maxconn 4096\ndefaults\n  mode http\n  timeout connect 1s\n  timeout client 120s\n  timeout server 120s\n  option redispatch\n  retries 3\n'
    printf 'frontend f\n  bind 127.0.0.1:%s\n  default_backend b\nbackend b\n  balance roundrobin\n' "$port"
    local i=0 b; for b in "$@"; do printf '  server g%s %s check inter 500ms\n' $i "$b"; i=$((i+1)); done
  } >"$WORK/haproxy.cfg"
  taskset -c 0 "$HAPROXY" -db -f "$WORK/haproxy.cfg" >"$OUT/haproxy.log" 2>&1 &
  HA_PID=$!; PIDS+=("$HA_PID")
  for _ in $(seq 1 100); do (echo >/dev/tcp/127.0.0.1/"$port") 2>/dev/null && break; sleep 0.1; done
  LB="127.0.0.1:$port"
}
js_messages() { # all GW_* messages JetStream holds
  curl -s "http://127.0.0.1:${MON[0]}/jsz?accounts=true&streams=true" \
    | python3 -c 'import json,sys; v=json.load(sys.stdin); print(sum(s["state"]["messages"] for a in v.get("account_details",[]) for s in a.get("stream_detail",[]) if s["name"].startswith("GW_")))'
}
applied() { curl -s "http://$1/metrics" | awk '/^gateway_cluster_applied_total/ {s+=$2} END {print s+0}'; }
wait_caught_up() { # admin...
  local want a; want=$(js_messages)
  for _ in $(seq 1 600); do
    local ok=1; for a in "$@"; do [[ $(applied "$a") -ge $want ]] || ok=0; done
    [[ $ok == 1 ]] && return 0; sleep 0.1
  done
  log "   (nodes did not catch up to $want within 60 s)"
}

# run_set LABEL PIDS ADMINS: the durable and fan-out benches through $LB
run_set() {
  local label=$1 pids=$2 u="http://$LB/v1/streams/{stream}"
  local np
  for np in 1 64; do
    log "-- $label: durable, $np sequential publisher(s), one POST in flight each"
    taskset -c 1 "$BENCH_BIN" durable --publish-url "$u/events" --fsync-probe-dir "$WORK" \
      --publishers "$np" --secs-per-run "$SECS" --stream-prefix "d$np-$label-" --json \
      >"$OUT/$label-durable$np.json" 2>"$OUT/$label-durable$np.err" || log "   durable exit $?"
  done
  local t0 t1; t0=$(ticks $pids)
  log "-- $label: fanout 1x100, 300 B, pipeline 16"
  taskset -c 1 "$BENCH_BIN" fanout --streams 1 --subscribers-per-stream 100 --pipeline-depth 16 \
    --payload-bytes 300 --events-per-stream $((SECS * 1000000)) --publish-secs-max "$SECS" \
    --publish-url "$u/events" --subscribe-url "$u" --publish-style gateway --id-style gateway \
    --stream-prefix "f-$label-" --label "$label" --target-pid "${pids// /,}" --json \
    >"$OUT/$label-fanout.json" 2>"$OUT/$label-fanout.err" || log "   fanout exit $?"
  t1=$(ticks $pids)
  echo "$((t1 - t0))" >"$OUT/$label-fanout.ticks"
}

# Single node, durable default, no NATS, through the same HAProxy.
read -r pid addr admin < <(start_gateway single)
PIDS+=("$pid"); start_haproxy "$addr"
run_set single "$pid"
kill -TERM "$pid" "$HA_PID"; wait "$pid" "$HA_PID" 2>/dev/null || true

for n in 1 2 3; do
  pids=(); addrs=(); admins=()
  for i in $(seq 1 "$n"); do
    # shellcheck disable=SC2046
    read -r pid addr admin < <(start_gateway "c$n-$i" $(nats_args))
    PIDS+=("$pid"); pids+=("$pid"); addrs+=("$addr"); admins+=("$admin")
  done
  wait_caught_up "${admins[@]}"
  start_haproxy "${addrs[@]}"
  run_set "cluster$n" "${pids[*]}"
  kill -TERM "${pids[@]}" "$HA_PID"; wait "${pids[@]}" "$HA_PID" 2>/dev/null || true
done

# Catch-up of a fresh node.
want=$(js_messages)
t0=$(date +%s.%N)
# shellcheck disable=SC2046
read -r pid addr admin < <(start_gateway fresh $(nats_args))
PIDS+=("$pid")
for _ in $(seq 1 1200); do [[ $(applied "$admin") -ge $want ]] && break; sleep 0.05; done
t1=$(date +%s.%N); got=$(applied "$admin")
echo "$want $got $t0 $t1" >"$OUT/catchup.txt"
kill -TERM "$pid"; wait "$pid" 2>/dev/null || true

python3 - "$OUT" "$SECS" <<'PY' | tee "$OUT/table.md"
import json, sys, os
out, secs = sys.argv[1], int(sys.argv[2])
hz = os.sysconf("SC_CLK_TCK")
def rep(path):
    try:
        with open(path) as f: return json.load(f)
    except Exception: return None
print("| setup | publish p50 / p99 ms (1 publisher) | acked ev/s (1) | p50 / p99 ms (64) | acked ev/s (64) | fan-out delivered ev/s | gateways' CPU µs / delivered event (all nodes) | violations |")
print("|---|---|---|---|---|---|---|---|")
for label in ["single", "cluster1", "cluster2", "cluster3"]:
    f = rep(f"{out}/{label}-fanout.json")
    cells = []
    for np in (1, 64):
        d = rep(f"{out}/{label}-durable{np}.json") or {}
        r = (d.get("rows") or [{}])[0]
        lat = r.get("latency") or {}
        cells.append(f"{lat.get('p50_ms', 0):.2f} / {lat.get('p99_ms', 0):.2f}" if lat else "—")
        cells.append(f"{r.get('events_per_sec', 0):,.0f}" if r else "—")
    fr = (f or {}).get("reports", [{}])[-1] if f else {}
    dps, win = fr.get("delivered_per_sec"), fr.get("window_secs")
    try: ticks = int(open(f"{out}/{label}-fanout.ticks").read())
    except Exception: ticks = None
    cpu = "—"
    server = fr.get("server") or {}
    if server.get("cpu_us_per_delivered_event") is not None:
        cpu = f"{server['cpu_us_per_delivered_event']:.2f}"
    elif dps and win and ticks is not None:
        # the ticks span the whole bench process (setup and drain included): an upper bound
        cpu = f"{ticks / hz * 1e6 / (dps * win):.2f}"
    print(f"| {label} | " + " | ".join(cells) + f" | {dps or 0:,.0f} | {cpu} | {fr.get('violations', '—')} |")
try:
    want, got, t0, t1 = open(f"{out}/catchup.txt").read().split()
    dt = float(t1) - float(t0)
    print(f"\nCatch-up: a fresh node applied {int(got):,} of {int(want):,} messages in {dt:.2f} s "
          f"(start-up included): {int(got)/dt:,.0f} events/s")
except Exception as e:
    print(f"catch-up: no figure ({e})")
PY
