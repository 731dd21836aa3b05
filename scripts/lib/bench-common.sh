# shellcheck shell=bash disable=SC2034 # STATUS is set here for the sourcing script
# bench-common.sh: shell functions shared by the bench scripts (bench-tls.sh, bench-ab.sh,
# bench-auth.sh, compare-nchan.sh). Sourced, never run; it only defines functions (no options,
# traps or variables), so it is safe under the caller's `set -euo pipefail`. Source it before the
# script changes directory:
#   source "$(dirname "$0")/lib/bench-common.sh"
#
# Globals: the functions below that say so read (and some set) the caller's globals:
#   OUT        results dir; run.log there is the run's log
#   WORK       the script's private temp dir
#   GW_PID     pid of the gateway under test, or empty when none runs
#   STATUS     the script's exit status so far; set to 1 on a failure
#   BENCH_BIN / BENCH_CORE  the bench binary and the core it is pinned to
# Every wait is bounded.

# require_count NAME VALUE MAX: exit 2 with "NAME must be 1..MAX" unless VALUE is a whole
# number from 1 to MAX.
require_count() {
  local name=$1 value=$2 max=$3
  [[ $value =~ ^[1-9][0-9]*$ && $value -le $max ]] || { echo "$name must be 1..$max" >&2; exit 2; }
}

# raise_nofile_limit: raise this shell's soft descriptor limit (inherited by every process it
# starts) to 1048576, or to the hard limit when that is not allowed.
raise_nofile_limit() {
  ulimit -n 1048576 2>/dev/null || ulimit -n "$(ulimit -Hn)"
}

# make_self_signed_cert DIR: a throwaway self-signed P-256 certificate for CN=localhost and
# subjectAltName IP:127.0.0.1, valid 2 days: DIR/c.pem (certificate) and DIR/k.pem (key). DIR
# must exist. Fails (openssl's status) when openssl does.
make_self_signed_cert() {
  local dir=$1
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$dir/k.pem" \
    -out "$dir/c.pem" -days 2 -subj /CN=localhost -addext subjectAltName=IP:127.0.0.1 2>/dev/null
}

# run_log MESSAGE...: print MESSAGE and append it to $OUT/run.log (global OUT).
run_log() {
  echo "$*" | tee -a "$OUT/run.log"
}

# stop_gateway: stop the gateway GW_PID (global; nothing to do when empty): SIGTERM, a bounded
# wait (50 x 0.1 s), then SIGKILL (noted in run.log, global OUT); reaps the child and clears
# GW_PID.
stop_gateway() {
  [[ -n $GW_PID ]] || return 0
  kill -TERM "$GW_PID" 2>/dev/null || true
  for _ in $(seq 1 50); do kill -0 "$GW_PID" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$GW_PID" 2>/dev/null; then
    run_log "   gateway $GW_PID ignored SIGTERM for 5 s: SIGKILL"
    kill -KILL "$GW_PID" 2>/dev/null || true
  fi
  wait "$GW_PID" 2>/dev/null || true
  GW_PID=""
}

# stop_gateway_and_remove_work: the EXIT trap of a script that runs one gateway at a time:
# stop_gateway, then remove the temp dir WORK (global).
stop_gateway_and_remove_work() {
  stop_gateway
  rm -rf "$WORK"
}

# wait_for_listen_addr LOG PID: print the address (IP:PORT) of the gateway's first
# "listening on IP:PORT" line in LOG; print nothing when none appears within 10 s (100 x 0.1 s)
# or PID exits first. Always returns 0; LOG need not exist yet.
wait_for_listen_addr() {
  local log=$1 pid=$2 addr=""
  for _ in $(seq 1 100); do
    addr=$(sed -n 's/^listening on \([0-9.]*:[0-9]*\).*/\1/p' "$log" 2>/dev/null | head -1 || true)
    [[ -n $addr ]] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "$addr"
}

# gateway_did_not_listen LABEL LOG: the gateway printed no "listening on": log
# "-- LABEL: the gateway printed no 'listening on'; log:" and LOG's last 5 lines to run.log,
# stop_gateway, and set STATUS=1 (globals OUT, GW_PID, STATUS).
gateway_did_not_listen() {
  local label=$1 log=$2
  run_log "-- $label: the gateway printed no 'listening on'; log:"
  tail -n 5 "$log" | tee -a "$OUT/run.log"
  stop_gateway
  STATUS=1
}

# run_bench LABEL FILE TIMEOUT_SECS BENCH_ARG...: one bench run against the gateway GW_PID.
# Logs "-- LABEL (load average ...): bench BENCH_ARG..." to run.log; runs
# `timeout --kill-after=10 TIMEOUT_SECS taskset -c BENCH_CORE BENCH_BIN BENCH_ARG...` with
# stdout to FILE.json and stderr to FILE.err; writes its exit status to FILE.rc; notes in
# run.log a gateway that is gone (its log: FILE.gateway.log) and a nonzero exit (with the last
# lines of FILE.err), the latter also setting STATUS=1. Always returns 0; the gateway keeps
# running. Globals: OUT, GW_PID, STATUS, BENCH_BIN, BENCH_CORE.
run_bench() {
  local label=$1 file=$2 secs=$3 rc=0
  shift 3
  run_log "-- $label (load average $(cut -d' ' -f1-3 /proc/loadavg)): bench $*"
  timeout --kill-after=10 "$secs" taskset -c "$BENCH_CORE" "$BENCH_BIN" "$@" \
    >"$file.json" 2>"$file.err" || rc=$?
  echo "$rc" >"$file.rc"
  if ! kill -0 "$GW_PID" 2>/dev/null; then
    run_log "   THE GATEWAY PROCESS IS GONE (see $file.gateway.log)"
  fi
  if [[ $rc -ne 0 ]]; then
    run_log "   bench exit $rc: $(tail -n 3 "$file.err")"
    STATUS=1
  fi
}

# free_port: print a TCP port on 127.0.0.1 that is free now.
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# kill_pids_and_remove_work: SIGKILL every process in the caller's array PIDS, reap them, and
# remove WORK (globals PIDS, WORK). For `trap ... EXIT`.
kill_pids_and_remove_work() {
  local p f
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
  # Servers' logs in OUT keep their last 1,000 lines (a gateway's access log runs to tens of
  # MB in a benchmark; the end holds a crash's message).
  for f in "${OUT:-/nonexistent}"/*.log; do
    [[ -f $f && $(stat -c %s "$f") -gt 1000000 ]] || continue
    tail -n 1000 "$f" >"$f.tail" && mv "$f.tail" "$f"
  done
}

# start_nats_cluster CPUS: three nats-server ($NATS_SERVER) forming one JetStream cluster on
# loopback (R3-capable, `sync_interval: always`, stores under $WORK, logs $OUT/nats<i>.log),
# pinned with `taskset -c CPUS` unless CPUS is empty. Sets NATS_URLS (client URLs) and MON
# (monitoring ports), appends the pids to PIDS (globals NATS_SERVER, WORK, OUT, PIDS).
start_nats_cluster() {
  local cpus=$1 i cp mp rports=() routes=() pin=()
  [[ -n $cpus ]] && pin=(taskset -c "$cpus")
  NATS_URLS=() MON=()
  for i in 0 1 2; do rports+=("$(free_port)"); done
  for i in 0 1 2; do routes+=("nats-route://127.0.0.1:${rports[$i]}"); done
  for i in 0 1 2; do
    cp=$(free_port) mp=$(free_port)
    NATS_URLS+=("nats://127.0.0.1:$cp") MON+=("$mp")
    cat >"$WORK/n$i.conf" <<CONF
server_name: n$i
listen: 127.0.0.1:$cp
http: 127.0.0.1:$mp
jetstream { store_dir: "$WORK/js$i", sync_interval: always }
cluster { name: gw, listen: 127.0.0.1:${rports[$i]}, routes: [$(IFS=,; echo "${routes[*]}")] }
CONF
    "${pin[@]}" "$NATS_SERVER" -c "$WORK/n$i.conf" >"$OUT/nats$i.log" 2>&1 &
    PIDS+=($!)
  done
}
