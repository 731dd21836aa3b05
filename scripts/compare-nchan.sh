#!/usr/bin/env bash
# compare-nchan.sh: run the same bench scenarios against nginx + nchan and against the gateway,
# in one run on this machine, servers pinned to one core and the bench to another, and print
# the ratios; then show nchan's silent gap on a too-old Last-Event-ID beside the gateway's
# explicit answer (410, or `event: truncated`).
#
# It installs nginx + libnginx-mod-nchan from Debian if missing, writes a private nginx config
# on loopback in a temp dir, builds bench and gateway in release, and kills every process it
# started on exit (trap). Every wait is bounded. Results (JSON per scenario and system, each
# with the bench's meta object and the latency distribution; the ratio table, the gap demo;
# with --plot the latency distributions drawn by scripts/plot.py) go to --out.
#
# Usage: scripts/compare-nchan.sh [--secs N] [--repeat N] [--idle-connections N] [--out DIR]
#        [--quick] [--skip-idle] [--plot] [--only NAME[,NAME...]] [--tls]
# --repeat N runs every load scenario N times, alternating nchan and gateway, and the ratio
# table quotes medians (the machine is shared and noisy). --only runs just the named scenarios
# (latency-1x100, fanout-1x100, fanout-1x100-depth1, streams-1000x1, streams-100x1-depth1,
# streams-100x1-depth16, streams-100x1-rate10k, resume-storm,
# fanout-1x100-batch100, slow, idle, mcp; the gap demo always runs).
# --tls: both servers serve the load scenarios over TLS (a P-256 self-signed certificate made
# with openssl at start; nginx `listen ... ssl` with ssl_certificate on its own port, the
# gateway --tls-cert-file/--tls-key-file) and the bench speaks https:// with --ca-file; the
# gap demo, metrics and MCP stay in the clear; idle is skipped. The ratio table adds delivered
# events per server CPU-second.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
# After ROOT, not before the cd: --help prints this file's lines 2-24 (the header).
# shellcheck source=SCRIPTDIR/lib/bench-common.sh
source "$ROOT/scripts/lib/bench-common.sh"

SECS=10                 # publishing seconds per load scenario
REPEAT=1                # rounds per load scenario (medians are quoted)
IDLE=50000              # idle connections per system
OUT=""
QUICK=0
SKIP_IDLE=0
PLOT=0
ONLY=""
SERVER_CORE=0
BENCH_CORE=1
NCHAN_PORT=18081
GW_PORT=18080
GW_ADMIN_PORT=18090
GW_DEMO_PORT=18082
GW_MCP_PORT=18083
NCHAN_TLS_PORT=18084
TLS=0

while [[ $# -gt 0 ]]; do
  case "$1" in
    --secs) SECS="$2"; shift 2 ;;
    --repeat) REPEAT="$2"; shift 2 ;;
    --idle-connections) IDLE="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --quick) QUICK=1; shift ;;
    --skip-idle) SKIP_IDLE=1; shift ;;
    --plot) PLOT=1; shift ;;
    --only) ONLY=",$2,"; shift 2 ;;
    --tls) TLS=1; shift ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
if [[ $QUICK == 1 ]]; then SECS=2; IDLE=2000; fi
if [[ $TLS == 1 && $SKIP_IDLE == 0 ]]; then
  echo "note: --tls skips the idle scenario (it measures plaintext connection memory)" >&2
  SKIP_IDLE=1
fi
OUT=${OUT:-$ROOT/target/compare-nchan/$(date -u +%Y%m%dT%H%M%SZ)$([[ $TLS == 1 ]] && echo -tls)}
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/compare-nchan.XXXXXX)
PIDS=()

cleanup() {
  local p
  for p in "${PIDS[@]}"; do
    kill "$p" 2>/dev/null || true
  done
  for p in "${PIDS[@]}"; do
    # Bounded wait: 50 x 0.1 s, then SIGKILL.
    for _ in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null || true
  done
  # Keep the servers' own output (a crash's message) with the results: the last 1,000 lines
  # (the gateway's access log makes its output hundreds of MB in a saturating run).
  local f
  for f in "$WORK"/*.log; do
    [[ -f $f ]] && tail -n 1000 "$f" >"$OUT/$(basename "$f")"
  done
  cp "$WORK"/nginx/error.log "$OUT"/nginx-error.log 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

NPROC=$(nproc)
if [[ $NPROC -lt 2 ]]; then
  echo "note: 1 core only: server and bench share core 0" >&2
  BENCH_CORE=0
fi

# 1. nginx + nchan from Debian, if missing.
if ! command -v nginx >/dev/null || [[ ! -f /usr/lib/nginx/modules/ngx_nchan_module.so ]]; then
  echo "== installing nginx + libnginx-mod-nchan (Debian)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx libnginx-mod-nchan >/dev/null
fi

# 2. Release builds.
echo "== building bench and gateway (release)"
cargo build --release -q -p bench -p gateway
BENCH=$ROOT/target/release/bench
GATEWAY=$ROOT/target/release/gateway

# Both servers and the bench may hold 50k+ sockets. Without CAP_SYS_RESOURCE the hard limit
# cannot be raised; then every process gets the hard limit and the idle scenario is capped by it.
raise_nofile_limit
echo "== RLIMIT_NOFILE for servers and bench: $(ulimit -n)"

# 2b. --tls: a self-signed P-256 certificate for 127.0.0.1, for both servers; nginx gets a
#     second server block on its own port with the load scenarios' locations over TLS.
# The load scenarios' nginx locations (literal nginx variables), in the clear and over TLS.
# shellcheck disable=SC2016 # $arg_id etc. are nginx's, not the shell's
NCHAN_LOAD_LOCATIONS='    # Publisher: POST body = message.
    location = /pub {
      nchan_publisher http;
      nchan_channel_id $arg_id;
      nchan_message_buffer_length 2000000;
      nchan_message_timeout 1h;
    }
    # EventSource subscriber honouring Last-Event-ID (header or ?last_event_id=).
    location = /sub {
      nchan_subscriber eventsource;
      nchan_channel_id $arg_id;
      nchan_subscriber_last_message_id $http_last_event_id $arg_last_event_id;
    }'
GW_TLS_ARGS=()
TLS_SERVER=""
if [[ $TLS == 1 ]]; then
  mkdir -p "$WORK/tls"
  make_self_signed_cert "$WORK/tls"
  cp "$WORK/tls/c.pem" "$OUT/cert.pem"
  GW_TLS_ARGS=(--tls-cert-file "$WORK/tls/c.pem" --tls-key-file "$WORK/tls/k.pem")
  TLS_SERVER="  server {
    listen 127.0.0.1:$NCHAN_TLS_PORT ssl backlog=65535;
    ssl_certificate $WORK/tls/c.pem;
    ssl_certificate_key $WORK/tls/k.pem;
    ssl_protocols TLSv1.2 TLSv1.3;
$NCHAN_LOAD_LOCATIONS
  }"
fi

# 3. Private nginx config on loopback. One worker: the server gets one pinned core, as the
#    gateway does (--cores 1).
mkdir -p "$WORK/nginx"
cat > "$WORK/nginx/nginx.conf" <<EOF
load_module /usr/lib/nginx/modules/ngx_nchan_module.so;
worker_processes 1;
worker_rlimit_nofile 1048576;
pid $WORK/nginx/nginx.pid;
error_log $WORK/nginx/error.log warn;
daemon off;
events { worker_connections 200000; multi_accept on; }
http {
  access_log off;
  client_body_temp_path $WORK/nginx/body;
  proxy_temp_path $WORK/nginx/proxy;
  fastcgi_temp_path $WORK/nginx/fcgi;
  uwsgi_temp_path $WORK/nginx/uwsgi;
  scgi_temp_path $WORK/nginx/scgi;
  keepalive_requests 1000000000;
  nchan_max_reserved_memory 1024M;
  server {
    listen 127.0.0.1:$NCHAN_PORT backlog=65535;
$NCHAN_LOAD_LOCATIONS
    # The gap demo: the same, with a 10-message buffer.
    location = /pubsmall {
      nchan_publisher http;
      nchan_channel_id \$arg_id;
      nchan_message_buffer_length 10;
    }
    location = /subsmall {
      nchan_subscriber eventsource;
      nchan_channel_id \$arg_id;
      nchan_subscriber_last_message_id \$http_last_event_id \$arg_last_event_id;
    }
  }
$TLS_SERVER
}
EOF

wait_port() { # bounded: 100 x 0.1 s
  local port=$1
  for _ in $(seq 1 100); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  echo "nothing listens on 127.0.0.1:$port" >&2
  return 1
}

wait_listening() { # bounded: 100 x 0.1 s
  local log=$1
  for _ in $(seq 1 100); do
    grep -q "listening on" "$log" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "gateway did not print 'listening on'; log:" >&2
  cat "$log" >&2
  return 1
}

echo "== starting nginx+nchan on core $SERVER_CORE (127.0.0.1:$NCHAN_PORT, 1 worker)"
taskset -c "$SERVER_CORE" nginx -c "$WORK/nginx/nginx.conf" -p "$WORK/nginx" &
NGINX_PID=$!
PIDS+=("$NGINX_PID")
wait_port "$NCHAN_PORT"
if [[ $TLS == 1 ]]; then wait_port "$NCHAN_TLS_PORT"; fi

echo "== starting gateway on core $SERVER_CORE (127.0.0.1:$GW_PORT, --cores 1, --fsync never like nchan's memory store)"
taskset -c "$SERVER_CORE" "$GATEWAY" --listen "127.0.0.1:$GW_PORT" --data-dir "$WORK/gw-data" \
  --admin-listen "127.0.0.1:$GW_ADMIN_PORT" --connections-per-ip-max 0 \
  --cores 1 --fsync never --connections-max 200000 "${GW_TLS_ARGS[@]}" >"$WORK/gateway.log" 2>&1 &
GW_PID=$!
PIDS+=("$GW_PID")
wait_listening "$WORK/gateway.log"

echo "== gap-demo gateway on core $SERVER_CORE (127.0.0.1:$GW_DEMO_PORT, 256 KiB segments, 512 KiB retained)"
taskset -c "$SERVER_CORE" "$GATEWAY" --listen "127.0.0.1:$GW_DEMO_PORT" --data-dir "$WORK/gw-demo" \
  --admin-listen 127.0.0.1:0 --connections-per-ip-max 0 \
  --cores 1 --fsync never --segment-bytes 262144 --retain-bytes 524288 --event-bytes-max 4096 \
  >"$WORK/gateway-demo.log" 2>&1 &
PIDS+=("$!")
wait_listening "$WORK/gateway-demo.log"

NCHAN_ARGS=(--publish-url "http://127.0.0.1:$NCHAN_PORT/pub?id={stream}"
  --subscribe-url "http://127.0.0.1:$NCHAN_PORT/sub?id={stream}"
  --publish-style nchan --id-style nchan --target-pid "$NGINX_PID" --target-children --label nchan)
GW_ARGS=(--publish-url "http://127.0.0.1:$GW_PORT/v1/streams/{stream}/events"
  --publish-batch-url "http://127.0.0.1:$GW_PORT/v1/streams/{stream}/events:batch"
  --subscribe-url "http://127.0.0.1:$GW_PORT/v1/streams/{stream}"
  --publish-style gateway --id-style gateway --target-pid "$GW_PID" --label gateway
  --metrics-url "http://127.0.0.1:$GW_ADMIN_PORT/metrics")
if [[ $TLS == 1 ]]; then
  NCHAN_ARGS=(--publish-url "https://127.0.0.1:$NCHAN_TLS_PORT/pub?id={stream}"
    --subscribe-url "https://127.0.0.1:$NCHAN_TLS_PORT/sub?id={stream}" --ca-file "$WORK/tls/c.pem"
    --publish-style nchan --id-style nchan --target-pid "$NGINX_PID" --target-children --label nchan-tls)
  GW_ARGS=(--publish-url "https://127.0.0.1:$GW_PORT/v1/streams/{stream}/events"
    --publish-batch-url "https://127.0.0.1:$GW_PORT/v1/streams/{stream}/events:batch"
    --subscribe-url "https://127.0.0.1:$GW_PORT/v1/streams/{stream}" --ca-file "$WORK/tls/c.pem"
    --publish-style gateway --id-style gateway --target-pid "$GW_PID" --label gateway-tls
    --metrics-url "http://127.0.0.1:$GW_ADMIN_PORT/metrics")
  echo "== TLS: nchan on 127.0.0.1:$NCHAN_TLS_PORT (ssl), gateway on 127.0.0.1:$GW_PORT (rustls)"
fi

echo "== servers pinned to core $SERVER_CORE, bench pinned to core $BENCH_CORE (taskset)"
echo "== results in $OUT"

STATUS=0
# A publisher connection whose responses stop parsing leaves its last bytes each way here.
export BENCH_TRACE_DIR=$OUT
# wanted NAME: is this scenario selected (all are, without --only)?
wanted() { [[ -z $ONLY || $ONLY == *",$1,"* ]]; }
# run_one NAME SYSTEM ROUND BENCH-ARGS...: one scenario against one system.
run_one() {
  local name=$1 sys=$2 round=$3; shift 3
  local args file
  if [[ $sys == nchan ]]; then args=("${NCHAN_ARGS[@]}"); else args=("${GW_ARGS[@]}"); fi
  file="$OUT/$name-$sys"
  if [[ $round -gt 1 ]]; then file="$file.r$round"; fi
  echo "-- $name [$sys] round $round (load average $(cut -d' ' -f1-3 /proc/loadavg)): bench $*"
  local rc=0
  timeout $((SECS * 3 + 90)) taskset -c "$BENCH_CORE" "$BENCH" "$@" "${args[@]}" --json \
    >"$file.json" 2>"$file.err" || rc=$?
  echo "$rc" >"$file.rc"
  if [[ $sys == gateway ]] && ! kill -0 "$GW_PID" 2>/dev/null; then
    echo "   THE GATEWAY PROCESS IS GONE (see gateway.log in $OUT)"
  fi
  if [[ $rc -ne 0 ]]; then
    echo "   exit $rc: $(tail -n 3 "$file.err")"
    if [[ $rc -eq 1 ]]; then STATUS=1; fi
  fi
  return 0
}
# run_both NAME BENCH-ARGS...: the same scenario against nchan and the gateway, REPEAT rounds.
run_both() {
  local name=$1; shift
  local round
  wanted "$name" || return 0
  for round in $(seq 1 "$REPEAT"); do
    run_one "$name" nchan "$round" "$@"
    run_one "$name" gateway "$round" "$@"
  done
}

EV=$((SECS * 2000000))
# Latency at a fixed rate both servers sustain (the saturating runs below measure queueing).
run_both latency-1x100 fanout --streams 1 --subscribers-per-stream 100 --events-per-stream "$EV" \
  --publish-secs-max "$SECS" --rate-events-per-sec 1000
run_both fanout-1x100 fanout --streams 1 --subscribers-per-stream 100 --events-per-stream "$EV" \
  --publish-secs-max "$SECS" --pipeline-depth 64
# One publish in flight (unbatched): per-event cost without pipelining.
run_both fanout-1x100-depth1 fanout --streams 1 --subscribers-per-stream 100 --events-per-stream "$EV" \
  --publish-secs-max "$SECS" --pipeline-depth 1
run_both streams-1000x1 fanout --streams 1000 --subscribers-per-stream 1 --events-per-stream "$EV" \
  --publishers 4 --publish-secs-max "$SECS" --pipeline-depth 64
# Many streams, one subscriber each, 4 publisher connections (issue 26's tail): one POST in
# flight per connection (the plain case), then 16 pipelined.
run_both streams-100x1-depth1 fanout --streams 100 --subscribers-per-stream 1 --events-per-stream "$EV" \
  --publishers 4 --publish-secs-max "$SECS" --pipeline-depth 1
run_both streams-100x1-depth16 fanout --streams 100 --subscribers-per-stream 1 --events-per-stream "$EV" \
  --publishers 4 --publish-secs-max "$SECS" --pipeline-depth 16
# The plain case again at a fixed 10,000 events/s, which both servers sustain: the tails at the
# same load. Unpaced, each server runs at its own saturation, and the faster one also keeps the
# load generator busier.
run_both streams-100x1-rate10k fanout --streams 100 --subscribers-per-stream 1 --events-per-stream "$EV" \
  --publishers 4 --publish-secs-max "$SECS" --pipeline-depth 1 --rate-events-per-sec 10000
run_both resume-storm resume-storm --streams 10 --subscribers-per-stream 10 \
  --events-per-stream "$EV" --rate-events-per-sec 5000 --cuts-per-sec 200 --publish-secs-max "$SECS"
# Gateway only (nchan has no batch publish): the same fanout with 100-event batch POSTs.
for round in $(seq 1 "$REPEAT"); do
  wanted fanout-1x100-batch100 || break
  run_one fanout-1x100-batch100 gateway "$round" fanout --streams 1 --subscribers-per-stream 100 \
    --events-per-stream "$EV" --publish-secs-max "$SECS" --pipeline-depth 4 --batch-events 100
done
run_both slow slow --streams 1 --subscribers-per-stream 50 --slow-subscribers-per-stream 10 \
  --events-per-stream "$EV" --rate-events-per-sec 2000 --publish-secs-max "$SECS" --drain-secs-max 2
if [[ $SKIP_IDLE == 0 ]]; then
  # Different source address ranges per system: the first run's closed connections sit in
  # TIME_WAIT on their ports.
  NCHAN_ARGS+=(--source-addr-first 1)
  GW_ARGS+=(--source-addr-first 101)
  REPEAT=1 run_both idle idle --connections "$IDLE" --streams 100 --hold-secs 3 --connect-secs-max 60 \
    --connects-inflight-max 1024
fi

# MCP sessions with cuts and resumes: gateway only (nchan has no MCP front); needs Node for the
# fixture (scripts/setup-node.sh), skipped without it.
NODE_BIN=$ROOT/.tools/node22/node_modules/.bin
[[ -x $NODE_BIN/node ]] || NODE_BIN=$(dirname "$(command -v node 2>/dev/null || echo /nonexistent/node)")
if ! wanted mcp; then
  :
elif [[ -x $NODE_BIN/node && -d $ROOT/mcp-fixture/node_modules ]]; then
  echo "== MCP gateway on core $SERVER_CORE (127.0.0.1:$GW_MCP_PORT, mcp-fixture upstream)"
  PATH=$NODE_BIN:$PATH taskset -c "$SERVER_CORE" "$GATEWAY" --listen "127.0.0.1:$GW_MCP_PORT" \
    --admin-listen 127.0.0.1:0 --connections-per-ip-max 0 \
    --data-dir "$WORK/gw-mcp" --cores 1 --upstream-cmd "node '$ROOT/mcp-fixture/server.mjs'" \
    >"$WORK/gateway-mcp.log" 2>&1 &
  PIDS+=("$!")
  wait_listening "$WORK/gateway-mcp.log"
  echo "-- mcp [gateway]: bench mcp --sessions 20 --calls-per-session 3 --progress-count 200 --cuts-per-call 3"
  rc=0
  timeout 300 taskset -c "$BENCH_CORE" "$BENCH" mcp --mcp-url "http://127.0.0.1:$GW_MCP_PORT/mcp" \
    --sessions 20 --calls-per-session 3 --progress-count 200 --interval-ms 2 --cuts-per-call 3 \
    >"$OUT/mcp-gateway.txt" 2>&1 || rc=$?
  cat "$OUT/mcp-gateway.txt"
  if [[ $rc -eq 1 ]]; then STATUS=1; fi
else
  echo "== skipping mcp: no node or no mcp-fixture/node_modules (run scripts/setup-node.sh)"
fi

echo
echo "== ratios (gateway / nchan; same scenario, same run)"
python3 - "$OUT" <<'PY' | tee "$OUT/ratios.md"
import glob, json, os, statistics, sys
out = sys.argv[1]
def median_report(reports):
    # Median of every numeric leaf over the rounds (other leaves from the first round).
    def merge(vals):
        first = vals[0]
        if isinstance(first, dict):
            return {k: merge([v.get(k) for v in vals if isinstance(v, dict)]) for k in first}
        nums = [v for v in vals if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if nums and len(nums) == len(vals):
            return statistics.median(nums)
        return first
    return merge(reports)
def load(name, sys_, idx=-1):
    reps = []
    for p in sorted(glob.glob(os.path.join(out, f"{name}-{sys_}.json")) +
                    glob.glob(os.path.join(out, f"{name}-{sys_}.r*.json"))):
        try:
            reps.append(json.load(open(p))["reports"][idx])
        except Exception:
            pass
    return median_report(reps) if reps else None
rounds = max((len(glob.glob(os.path.join(out, f"{sc}-nchan*.json")))
              for sc in ["latency-1x100", "fanout-1x100", "fanout-1x100-depth1", "streams-1000x1", "streams-100x1-depth1", "streams-100x1-depth16", "streams-100x1-rate10k", "resume-storm", "slow"]),
             default=0)
print(f"Medians over {rounds} round(s) per scenario and system.")
print()
def cpu_us(r):
    s = r.get("server") or {}
    return s.get("cpu_us_per_delivered_event")
def rss(r):
    s = r.get("server") or {}
    return s.get("rss_peak_sampled_kib")
rows = []
print("| scenario | metric | nchan | gateway | gateway/nchan |")
print("|---|---|---:|---:|---:|")
def row(sc, metric, n, g, fmt="{:.0f}"):
    if n is None or g is None:
        r = "n/a"
    else:
        r = f"{g / n:.2f}" if n else "n/a"
    f = lambda v: "n/a" if v is None else fmt.format(v)
    print(f"| {sc} | {metric} | {f(n)} | {f(g)} | {r} |")
for sc in ["latency-1x100", "fanout-1x100", "fanout-1x100-depth1", "fanout-1x100-batch100", "streams-1000x1", "streams-100x1-depth1", "streams-100x1-depth16", "streams-100x1-rate10k", "resume-storm", "slow", "idle"]:
    n, g = load(sc, "nchan"), load(sc, "gateway")
    if n is None and g is None:
        continue
    n = n or {}; g = g or {}
    if sc != "idle":
        row(sc, "delivered events/s", n.get("delivered_per_sec"), g.get("delivered_per_sec"))
        row(sc, "published events/s", n.get("published_per_sec"), g.get("published_per_sec"))
        row(sc, "server CPU us / delivered event", cpu_us(n), cpu_us(g), "{:.2f}")
        per_cpu_s = lambda r: (1e6 / cpu_us(r)) if cpu_us(r) else None
        row(sc, "delivered events / server CPU-second", per_cpu_s(n), per_cpu_s(g))
        wait = lambda r: (r.get("server") or {}).get("runqueue_wait_secs")
        row(sc, "server threads' run-queue wait (s, summed)", wait(n), wait(g), "{:.2f}")
        row(sc, "latency p50 us", (n.get("latency") or {}).get("p50_us"), (g.get("latency") or {}).get("p50_us"))
        row(sc, "latency p99 us", (n.get("latency") or {}).get("p99_us"), (g.get("latency") or {}).get("p99_us"))
        row(sc, "latency p99.9 us", (n.get("latency") or {}).get("p999_us"), (g.get("latency") or {}).get("p999_us"))
        row(sc, "load generator's CPU s (bench, one core)", n.get("bench_cpu_secs"), g.get("bench_cpu_secs"), "{:.2f}")
    if sc == "slow":
        nb, gb = load(sc, "nchan", 0) or {}, load(sc, "gateway", 0) or {}
        p99 = lambda r: (r.get("latency") or {}).get("p99_us")
        q = lambda a, b: (p99(a) / p99(b)) if p99(a) and p99(b) else None
        row(sc, "fast p99 with slow / without", q(n, nb), q(g, gb), "{:.2f}")
        row(sc, "slow subscribers' backlog at end (events)", n.get("slow_backlog_events"), g.get("slow_backlog_events"))
    if sc == "resume-storm":
        for q in ("p50_us", "p99_us"):
            row(sc, f"resume (cut -> first event) {q[:-3]} us", (n.get("resume") or {}).get(q), (g.get("resume") or {}).get(q))
            row(sc, f"  of which cut -> 200 head {q[:-3]} us", (n.get("resume_headers") or {}).get(q), (g.get("resume_headers") or {}).get(q))
    if sc == "idle":
        row(sc, "connections held", n.get("subscribers_up"), g.get("subscribers_up"))
        row(sc, "server bytes / idle connection", n.get("idle_bytes_per_connection"), g.get("idle_bytes_per_connection"))
        row(sc, "server bytes / held connection (end of hold)", n.get("idle_bytes_per_held_connection"), g.get("idle_bytes_per_held_connection"))
    row(sc, "server peak RSS KiB", rss(n), rss(g))
    for k, v in sorted((g.get("server_metrics") or {}).items()):  # nonzero counters only
        if v:
            print(f"| {sc} | gateway {k} | | {v:.0f} | |")
    row(sc, "violations", n.get("violations"), g.get("violations"))
PY

echo
echo "== too-old Last-Event-ID: nchan (10-message buffer) vs gateway (512 KiB retained)"
{
  timeout 60 taskset -c "$BENCH_CORE" "$BENCH" gap-probe --events 5000 --resume-after-counter 5 \
    --publish-url "http://127.0.0.1:$NCHAN_PORT/pubsmall?id={stream}" \
    --subscribe-url "http://127.0.0.1:$NCHAN_PORT/subsmall?id={stream}" \
    --publish-style nchan --id-style nchan --label nchan || true
  timeout 60 taskset -c "$BENCH_CORE" "$BENCH" gap-probe --events 5000 --resume-after-counter 5 \
    --publish-url "http://127.0.0.1:$GW_DEMO_PORT/v1/streams/{stream}/events" \
    --subscribe-url "http://127.0.0.1:$GW_DEMO_PORT/v1/streams/{stream}" --label gateway || true
  timeout 60 taskset -c "$BENCH_CORE" "$BENCH" gap-probe --events 5000 --resume-after-counter 5 \
    --publish-url "http://127.0.0.1:$GW_DEMO_PORT/v1/streams/{stream}/events" \
    --subscribe-url "http://127.0.0.1:$GW_DEMO_PORT/v1/streams/{stream}" \
    --resume-query on_truncated=earliest --label "gateway ?on_truncated=earliest" || true
} | tee "$OUT/gap-demo.txt"

if [[ $PLOT == 1 ]]; then
  python3 "$ROOT/scripts/plot.py" latency "$OUT" --out "$OUT/latency.png" || echo "plot failed"
fi
echo
echo "== done: $OUT (exit $STATUS: 1 means a scenario reported invariant violations)"
exit "$STATUS"
