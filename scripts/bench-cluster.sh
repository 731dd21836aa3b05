#!/usr/bin/env bash
# bench-cluster.sh: cluster mode (--nats-url) through HAProxy with 1, 2 and 3 gateway nodes, in
# one run, beside a single-node gateway (durable default, no NATS) through the same HAProxy:
#   - publish latency: `bench durable` (1 sequential publisher, then 64; one POST in flight each)
#     -> p50/p99 and acknowledged events/s (cluster: JetStream R3 quorum ack + local apply);
#   - fan-out: `bench fanout` 1 stream x 100 subscribers, 300 B, RATE (1,000) events/s with
#     --pipeline-depth 16, SECS s, the subscribers on node 1 and the publisher on node N (not
#     through HAProxy, which would relay every delivered byte on the same core): node 1's CPU
#     per delivered event (bench --target-pid), the cost of a node that also applies every
#     event from JetStream;
#   - catch-up: a fresh gateway on an empty data directory; events applied per second until it
#     holds everything JetStream holds (gateway_cluster_applied_total vs /jsz).
# Usage: bash scripts/bench-cluster.sh
# Environment: GATEWAY_BIN / BENCH_BIN (default target/release/*), NATS_SERVER / HAPROXY (default
# from PATH; scripts/setup-cluster.sh installs them), SECS (default 5), OUT (results dir).
# Pinning (2 cores here): NATS servers, gateways and HAProxy on core 0, the bench on core 1.
set -euo pipefail
# shellcheck source=SCRIPTDIR/lib/bench-common.sh
source "$(dirname "$0")/lib/bench-common.sh"
cd "$(dirname "$0")/.."
ROOT=$(pwd)
GATEWAY_BIN=$(realpath "${GATEWAY_BIN:-$ROOT/target/release/gateway}")
BENCH_BIN=$(realpath "${BENCH_BIN:-$ROOT/target/release/bench}")
NATS_SERVER=${NATS_SERVER:-$(command -v nats-server || true)}
HAPROXY=${HAPROXY:-$(command -v haproxy || true)}
SECS=${SECS:-5}
RATE=${RATE:-1000}
OUT=${OUT:-/tmp/bench-cluster-$(date -u +%Y%m%dT%H%M%SZ)}
[[ -x $GATEWAY_BIN && -x $BENCH_BIN ]] || { echo "build first: cargo build --release -p gateway -p bench" >&2; exit 2; }
[[ -n $NATS_SERVER && -n $HAPROXY ]] || { echo "run scripts/setup-cluster.sh first" >&2; exit 2; }
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/bench-cluster.XXXXXX)
PIDS=()
trap kill_pids_and_remove_work EXIT
trap 'exit 130' INT TERM
log() { echo "$*" | tee -a "$OUT/run.log"; }


log "bench-cluster $(date -u +%FT%TZ): git $(git rev-parse --short HEAD), $SECS s per fan-out run, load $(cut -d' ' -f1-3 /proc/loadavg)"
log "pinning: nats-server x3, gateways, haproxy on core 0; bench on core 1"

# --- NATS: 3 nodes, JetStream R3, sync_interval always ---
start_nats_cluster 0

# JetStream's own floor in the same run: R3 publish latency with one sequential publisher and
# acknowledged messages/s with 64, from a Python client (nats-py) pinned beside the bench.
python3 -c 'import nats' 2>/dev/null \
  || python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore nats-py >&2
taskset -c 1 python3 - "${NATS_URLS[0]}" "$SECS" >"$OUT/jetstream-floor.json" <<'PY' || log "   JetStream floor probe failed"
import asyncio, json, sys, time
import nats
async def main(url, secs):
    nc = await nats.connect(url)
    js = nc.jetstream()
    deadline = time.monotonic() + 60
    while True:
        try:
            await js.add_stream(name="FLOOR", subjects=["floor"], num_replicas=3)
            break
        except Exception:
            if time.monotonic() > deadline: raise
            await asyncio.sleep(0.5)
    async def one(lat, until):
        while time.monotonic() < until:
            t = time.perf_counter()
            await js.publish("floor", b"x" * 300)
            lat.append((time.perf_counter() - t) * 1000)
    out = {}
    for n in (1, 64):
        lat = []
        until = time.monotonic() + secs
        await asyncio.gather(*(one(lat, until) for _ in range(n)))
        lat.sort()
        out[str(n)] = {"p50_ms": lat[len(lat) // 2], "p99_ms": lat[len(lat) * 99 // 100],
                       "per_sec": len(lat) / secs}
    await js.delete_stream("FLOOR")
    await nc.close()
    print(json.dumps(out))
asyncio.run(main(sys.argv[1], int(sys.argv[2])))
PY
log "JetStream floor (nats-py, R3, sync_interval always): $(cat "$OUT/jetstream-floor.json")"

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

# cpu_ticks PIDS...: CPU ticks (user + system) per process/thread name of the processes named,
# and core 0's busy and idle ticks; cpu_account LABEL: the difference over the 64-publisher run
# (CPU per acknowledged event of each part: what bounds the rate on this 2-core machine).
cpu_ticks() {
  local p t
  for p in "$@"; do
    for t in /proc/"$p"/task/*; do
      [[ -r $t/stat ]] || continue
      awk -v c="$(cat "/proc/$p/comm")/$(cat "$t/comm")" '{sub(/^.*\) /, ""); print c, $12 + $13}' "$t/stat" 2>/dev/null
    done
  done | awk '{s[$1] += $2} END {for (k in s) print k, s[k]}' | sort
  awk '/^cpu0 / {print "core0/busy", $2 + $3 + $4 + $7 + $8; print "core0/idle", $5 + $6}' /proc/stat
}
parts_pids() { echo "${NODE_PIDS[@]}" "$HA_PID" $(pgrep -f "$WORK/n[0-9].conf"); }

# run_set LABEL SUB_PID SUB_ADDR PUB_ADDR: the durable benches through $LB; the fan-out with
# its subscribers on one node (SUB_ADDR, whose CPU is measured) and its publisher on another
# (PUB_ADDR; the same node when there is one), at a fixed rate so every setup does the same work
run_set() {
  local label=$1 sub_pid=$2 sub_addr=$3 pub_addr=$4 u="http://$LB/v1/streams/{stream}"
  local np
  for np in 1 64; do
    log "-- $label: durable, $np sequential publisher(s), one POST in flight each"
    # shellcheck disable=SC2046
    [[ $np == 64 ]] && cpu_ticks $(parts_pids) >"$OUT/$label-cpu64.before"
    taskset -c 1 "$BENCH_BIN" durable --publish-url "$u/events" --fsync-probe-dir "$WORK" \
      --publishers "$np" --secs-per-run "$SECS" --stream-prefix "d$np-$label-" --json \
      >"$OUT/$label-durable$np.json" 2>"$OUT/$label-durable$np.err" || log "   durable exit $?"
    # shellcheck disable=SC2046
    [[ $np == 64 ]] && cpu_ticks $(parts_pids) >"$OUT/$label-cpu64.after"
  done
  log "-- $label: fanout 1x100, 300 B, $RATE ev/s, pipeline 16, subscribers on $sub_addr, publisher on $pub_addr"
  taskset -c 1 "$BENCH_BIN" fanout --streams 1 --subscribers-per-stream 100 --pipeline-depth 16 \
    --payload-bytes 300 --rate-events-per-sec "$RATE" --events-per-stream $((SECS * RATE)) \
    --publish-secs-max "$SECS" --publish-url "http://$pub_addr/v1/streams/{stream}/events" \
    --subscribe-url "http://$sub_addr/v1/streams/{stream}" --publish-style gateway \
    --id-style gateway --stream-prefix "f-$label-" --label "$label" --target-pid "$sub_pid" \
    --json >"$OUT/$label-fanout.json" 2>"$OUT/$label-fanout.err" || log "   fanout exit $?"
}

# Single node, durable default, no NATS, through the same HAProxy.
read -r pid addr admin < <(start_gateway single)
PIDS+=("$pid"); start_haproxy "$addr"
NODE_PIDS=("$pid")
run_set single "$pid" "$addr" "$addr"
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
  NODE_PIDS=("${pids[@]}")
  run_set "cluster$n" "${pids[0]}" "${addrs[0]}" "${addrs[$((n - 1))]}"
  kill -TERM "${pids[@]}" "$HA_PID"; wait "${pids[@]}" "$HA_PID" 2>/dev/null || true
done

# Catch-up of a fresh node: first more history (batches of 100 events for 3 x SECS s), then
# a gateway on an empty data directory; the rate is taken from its first applied message to
# its last (polled every 50 ms), start-up excluded.
# shellcheck disable=SC2046
read -r pid addr admin < <(start_gateway preload $(nats_args))
PIDS+=("$pid")
log "-- preload: batches of 100 events for $((SECS * 3)) s"
taskset -c 1 "$BENCH_BIN" fanout --streams 4 --subscribers-per-stream 1 --batch-events 100 \
  --pipeline-depth 4 --payload-bytes 300 --events-per-stream 100000000 \
  --publish-secs-max $((SECS * 3)) --publish-url "http://$addr/v1/streams/{stream}/events" \
  --publish-batch-url "http://$addr/v1/streams/{stream}/events:batch" \
  --subscribe-url "http://$addr/v1/streams/{stream}" --publish-style gateway --id-style gateway \
  --stream-prefix "pre-" --json >"$OUT/preload.json" 2>"$OUT/preload.err" || log "   preload exit $?"
kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
want=$(js_messages)
# shellcheck disable=SC2046
read -r pid addr admin < <(start_gateway fresh $(nats_args))
PIDS+=("$pid")
t0=""
for _ in $(seq 1 2400); do # bounded: 120 s
  got=$(applied "$admin")
  [[ -z $t0 && $got -gt 0 ]] && t0=$(date +%s.%N) && first=$got
  [[ $got -ge $want ]] && break
  sleep 0.05
done
t1=$(date +%s.%N); got=$(applied "$admin"); got=$((got - ${first:-0})); t0=${t0:-$t1}
echo "$want $got $t0 $t1" >"$OUT/catchup.txt"
kill -TERM "$pid"; wait "$pid" 2>/dev/null || true

python3 - "$OUT" "$SECS" <<'PY' | tee "$OUT/table.md"
import json, sys, os
out, secs = sys.argv[1], int(sys.argv[2])
def rep(path):
    try:
        with open(path) as f: return json.load(f)
    except Exception: return None
print("| setup | publish p50 / p99 ms (1 publisher) | acked ev/s (1) | p50 / p99 ms (64) | acked ev/s (64) | fan-out delivered ev/s | subscribers' node CPU µs / delivered event | violations |")
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
    cpu = "—"
    server = fr.get("server") or {}
    if server.get("cpu_us_per_delivered_event") is not None:
        cpu = f"{server['cpu_us_per_delivered_event']:.2f}"
    print(f"| {label} | " + " | ".join(cells) + f" | {dps or 0:,.0f} | {cpu} | {fr.get('violations', '—')} |")
try:
    fl = json.load(open(f"{out}/jetstream-floor.json"))
    print(f"| JetStream alone (nats-py) | {fl['1']['p50_ms']:.2f} / {fl['1']['p99_ms']:.2f} | "
          f"{fl['1']['per_sec']:,.0f} | {fl['64']['p50_ms']:.2f} / {fl['64']['p99_ms']:.2f} | "
          f"{fl['64']['per_sec']:,.0f} | — | — | — |")
except Exception as e:
    print(f"JetStream floor: no figure ({e})")
try:
    want, got, t0, t1 = open(f"{out}/catchup.txt").read().split()
    dt = float(t1) - float(t0)
    print(f"\nCatch-up: a fresh node applied {int(got):,} messages (of {int(want):,} JetStream "
          f"holds) in {dt:.2f} s after its first: {int(got)/max(dt, 1e-9):,.0f} events/s")
except Exception as e:
    print(f"catch-up: no figure ({e})")
# Where the CPU of the 64-publisher run went (ticks are 10 ms): per acknowledged event, by
# process/thread, summed over the gateway nodes, the NATS servers and HAProxy; core 0's share
# busy (everything but the bench is pinned there).
print("\nCPU per acknowledged event in the 64-publisher run (µs; core 0 = the servers' core):\n")
print("| setup | core 0 busy | gateway reactors | gateway nats threads | gateway other | NATS servers | HAProxy |")
print("|---|---:|---:|---:|---:|---:|---:|")
def ticks(path):
    d = {}
    try:
        for line in open(path):
            k, v = line.split()
            d[k] = int(v)
    except Exception:
        return None
    return d
for label in ["single", "cluster1", "cluster2", "cluster3"]:
    a, b = ticks(f"{out}/{label}-cpu64.before"), ticks(f"{out}/{label}-cpu64.after")
    d = rep(f"{out}/{label}-durable64.json") or {}
    r = (d.get("rows") or [{}])[0]
    events = r.get("events_per_sec", 0) * secs
    if not a or not b or not events:
        continue
    diff = {k: b.get(k, 0) - a.get(k, 0) for k in b}
    us = lambda pred: sum(v for k, v in diff.items() if pred(k)) * 10_000 / events
    busy, idle = diff.get("core0/busy", 0), diff.get("core0/idle", 0)
    gw = lambda k: k.startswith("gateway/")
    print(f"| {label} | {100 * busy / max(busy + idle, 1):.0f} % "
          f"| {us(lambda k: gw(k) and k.split('/')[1].startswith('core-')):.1f} "
          f"| {us(lambda k: gw(k) and k.split('/')[1] == 'nats'):.1f} "
          f"| {us(lambda k: gw(k) and not k.split('/')[1].startswith('core-') and k.split('/')[1] != 'nats'):.1f} "
          f"| {us(lambda k: k.startswith('nats-server/')):.1f} | {us(lambda k: k.startswith('haproxy/')):.1f} |")
PY
