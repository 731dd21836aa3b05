#!/usr/bin/env bash
# bench-auth.sh: the gateway's server CPU per publish with JWT authentication on and off, in one
# run, rounds alternating; prints per round and median CPU µs per publish and the ratios
# hs256/anon, es256/anon and anon/none (issue: JWT-authenticated publish, cached HS256/ES256,
# <= 1.1x the CPU per publish of anonymous).
#
# Usage: bash scripts/bench-auth.sh [ROUNDS=5]
# Environment:
#   OUT        results dir (default /tmp/bench-auth-<UTC date>): one JSON, .err, .rc and .wait
#              per run, the gateways' logs, run.log and table.md. Keep it outside the git work
#              tree while running (copy it in afterwards): a concurrent `git stash -u` or clean
#              there removes files mid-run.
#   SECS       publishing seconds per run (default 5; 1..60)
#   SERVER_CORE / BENCH_CORE  cores for the gateway and the bench (default 0 / 1)
#   NO_BUILD=1 skip `cargo build --release -p gateway -p bench` (use target/release as it is)
#   BUILD_TRIES  build attempts, 60 s apart (default 5: others may be mid-edit)
#   VARIANTS / WORKLOADS  which to run, space-separated (default "anon hs256 es256 none" /
#              "seq1 seq64 pipe16 rate50k")
#
# Variants (each run: a fresh gateway, `taskset -c SERVER_CORE gateway --cores 1 --listen
# 127.0.0.1:0 --admin-listen 127.0.0.1:0 --connections-per-ip-max 0 --fsync never --data-dir
# <fresh temp dir>` plus):
#   anon   --anonymous-publish '*' --anonymous-subscribe '*'          (bench sends no token)
#   hs256  --jwt-hs256-secret-file F (64 random hex chars)            (bench: HS256 token)
#   es256  --jwt-public-key-file P (P-256 public key PEM, openssl)     (bench: ES256 token)
#   none   no auth flags at all (the old default; open on loopback)   (bench sends no token)
#   anontok  anon's flags, but bench sends the HS256 token anyway (not run by default: the cost
#          of carrying and parsing the header without verifying it; the gateway looks for no
#          token when no key is configured)
# Tokens (scripts/mint-jwt.py): {"sub":"bench","exp":now+3600,"gateway":{"publish":["*"],
# "subscribe":["*"]}}, one per algorithm, reused on every request: after the first request each
# core's token cache answers (the "cached" case).
# Workloads (bench on BENCH_CORE, --target-pid the gateway, 300 B payloads):
#   seq1     bench durable --publishers 1   (one POST in flight, sequential; the plain case)
#   seq64    bench durable --publishers 64  (64 sequential publishers, one POST in flight each)
#   pipe16   bench fanout --streams 1 --subscribers-per-stream 0 --publishers 1
#            --pipeline-depth 16            (one keep-alive connection, 16 pipelined POSTs)
#   rate50k  pipe16 held at --rate-events-per-sec 50000 (the same work per second in every
#            variant, about half the core: CPU per publish without the batching effect of
#            different throughputs)
# CPU per publish = the gateway process's utime+stime delta over the run (/proc/<pid>/stat,
# read by bench) / publishes answered. Noise gauge: the gateway's run-queue wait over its life
# (sum of /proc/<pid>/task/*/schedstat field 2, read just before it is stopped): time it was
# runnable while something else held its core. Before the rounds each variant is checked once: a
# tokenless publish must be refused (401) under hs256/es256 and a tokened one accepted, and a
# small fan-out (1 subscriber, 200 events, the variant's token on subscribe and publish) must be
# clean. Round r runs the variants in the order anon hs256 es256 none when r is odd, reversed
# when even. Every wait is bounded; each gateway is stopped (SIGTERM, then SIGKILL after 5 s)
# after its run and on any exit. Exit status: 0 when every check and bench run passed, 1
# otherwise (the table is printed either way), 2 bad usage or failed build/setup.
set -euo pipefail
# shellcheck source=SCRIPTDIR/lib/bench-common.sh
source "$(dirname "$0")/lib/bench-common.sh"
cd "$(dirname "$0")/.."
ROOT=$(pwd)

if [[ $# -gt 1 || ${1:-} == -h || ${1:-} == --help ]]; then
  sed -n '2,50p' "$0" >&2
  exit 2
fi
ROUNDS=${1:-5}
SECS=${SECS:-5}
SERVER_CORE=${SERVER_CORE:-0}
BENCH_CORE=${BENCH_CORE:-1}
BUILD_TRIES=${BUILD_TRIES:-5}
OUT=${OUT:-/tmp/bench-auth-$(date -u +%Y%m%dT%H%M%SZ)}
require_count ROUNDS "$ROUNDS" 50
require_count SECS "$SECS" 60
for tool in taskset openssl python3 curl; do
  command -v "$tool" >/dev/null || { echo "missing: $tool" >&2; exit 2; }
done

if [[ ${NO_BUILD:-0} != 1 ]]; then
  for try in $(seq 1 "$BUILD_TRIES"); do
    if cargo build --release -p gateway -p bench; then break; fi
    if ((try == BUILD_TRIES)); then echo "build failed $BUILD_TRIES times" >&2; exit 2; fi
    echo "build failed (someone mid-edit?): retrying in 60 s ($try/$BUILD_TRIES)" >&2
    sleep 60
  done
fi

mkdir -p "$OUT"
OUT=$(realpath "$OUT")
WORK=$(mktemp -d /tmp/bench-auth.XXXXXX)
GW_PID=""   # the running gateway, read by stop_gateway and run_bench (lib/bench-common.sh)
# Private copies: a rebuild of target/release by someone else mid-run cannot mix binaries.
mkdir -p "$WORK/bin"
cp "$ROOT/target/release/gateway" "$ROOT/target/release/bench" "$WORK/bin/"
GW_BIN="$WORK/bin/gateway"
BENCH_BIN="$WORK/bin/bench"

# On any exit: stop_gateway (SIGTERM, bounded wait, SIGKILL), then remove WORK.
trap stop_gateway_and_remove_work EXIT
trap 'exit 130' INT TERM

# Keys and tokens (throwaway, in the temp dir only).
KEYS="$WORK/keys"
mkdir -p "$KEYS"
openssl rand -hex 32 | tr -d '\n' >"$KEYS/hs256.secret"
openssl ecparam -name prime256v1 -genkey -noout -out "$KEYS/es256.key.pem" 2>/dev/null
openssl ec -in "$KEYS/es256.key.pem" -pubout -out "$KEYS/es256.pub.pem" 2>/dev/null
python3 "$ROOT/scripts/mint-jwt.py" hs256 "$KEYS/hs256.secret" 3600 >"$KEYS/hs256.token"
python3 "$ROOT/scripts/mint-jwt.py" es256 "$KEYS/es256.key.pem" 3600 >"$KEYS/es256.token"

read -r -a VARIANTS <<<"${VARIANTS:-anon hs256 es256 none}"
read -r -a WORKLOADS <<<"${WORKLOADS:-seq1 seq64 pipe16 rate50k}"
for v in "${VARIANTS[@]}"; do
  [[ $v =~ ^(anon|anontok|hs256|es256|none)$ ]] || { echo "unknown variant $v" >&2; exit 2; }
done
for w in "${WORKLOADS[@]}"; do
  [[ $w =~ ^(seq1|seq64|pipe16|rate50k)$ ]] || { echo "unknown workload $w" >&2; exit 2; }
done
REVERSED=()
for ((i = ${#VARIANTS[@]} - 1; i >= 0; i--)); do REVERSED+=("${VARIANTS[i]}"); done
gateway_flags() { # VARIANT -> the variant's auth flags, one per line
  case $1 in
    anon | anontok) printf '%s\n' --anonymous-publish '*' --anonymous-subscribe '*' ;;
    hs256) printf '%s\n' --jwt-hs256-secret-file "$KEYS/hs256.secret" ;;
    es256) printf '%s\n' --jwt-public-key-file "$KEYS/es256.pub.pem" ;;
    none) ;;
  esac
}
token_flags() { # VARIANT -> bench's token flag, if any
  case $1 in
    hs256 | es256) printf '%s\n' --bearer-token-file "$KEYS/$1.token" ;;
    anontok) printf '%s\n' --bearer-token-file "$KEYS/hs256.token" ;;
  esac
}

{
  echo "bench-auth $(date -u +%FT%TZ): rounds $ROUNDS, $SECS s per run, gateway core $SERVER_CORE, bench core $BENCH_CORE, $(uname -r), $(nproc) cores"
  echo "gateway $(sha256sum "$GW_BIN" | cut -c1-16) (git $(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet HEAD -- gateway auth log-store mcp-front || echo ', with uncommitted changes'))"
  echo "bench   $(sha256sum "$BENCH_BIN" | cut -c1-16)"
  echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$OUT/run.log"
STATUS=0

# start_gateway VARIANT NAME: a fresh gateway on SERVER_CORE; sets GW_PID and ADDR (empty when
# it printed no "listening on" within 10 s).
start_gateway() {
  local variant=$1 name=$2 log data
  log="$OUT/$name.gateway.log"
  data="$WORK/data-$name"
  local flags=()
  mapfile -t flags < <(gateway_flags "$variant")
  taskset -c "$SERVER_CORE" "$GW_BIN" --cores 1 --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 \
    --connections-per-ip-max 0 --fsync never --data-dir "$data" "${flags[@]}" >"$log" 2>&1 &
  GW_PID=$!
  ADDR=$(wait_for_listen_addr "$log" "$GW_PID") # bounded: 10 s
  if [[ -z $ADDR ]]; then
    gateway_did_not_listen "$name" "$log" # stops it, STATUS=1
  fi
}

# check VARIANT: tokenless and tokened publishes answer as the variant says; a small clean fan-out.
check() {
  local variant=$1
  local name="check-$variant" want_anon tok=()
  start_gateway "$variant" "$name"
  [[ -n $ADDR ]] || return 0
  local u="http://$ADDR/v1/streams/{stream}"
  case $variant in hs256 | es256) want_anon=401 ;; *) want_anon=201 ;; esac
  local tokvar=$variant
  [[ $variant == anontok ]] && tokvar=hs256
  local got_anon got_tok
  got_anon=$(curl -s -m 5 -o /dev/null -w '%{http_code}' -X POST --data x "http://$ADDR/v1/streams/check/events" || true)
  if [[ $tokvar == hs256 || $tokvar == es256 ]]; then
    tok=(-H "Authorization: Bearer $(cat "$KEYS/$tokvar.token")")
  fi
  got_tok=$(curl -s -m 5 -o /dev/null -w '%{http_code}' "${tok[@]}" -X POST --data x "http://$ADDR/v1/streams/check/events" || true)
  local flags=() rc=0
  mapfile -t flags < <(token_flags "$variant")
  timeout --kill-after=10 60 taskset -c "$BENCH_CORE" "$BENCH_BIN" fanout --streams 1 \
    --subscribers-per-stream 1 --publishers 1 --pipeline-depth 16 --events-per-stream 200 \
    --payload-bytes 300 --publish-url "$u/events" --publish-batch-url "$u/events:batch" \
    --subscribe-url "$u" "${flags[@]}" >"$OUT/$name.txt" 2>&1 || rc=$?
  local ok=yes
  [[ $got_anon == "$want_anon" && $got_tok == 201 && $rc == 0 ]] || { ok=NO; STATUS=1; }
  run_log "-- check $variant: tokenless publish $got_anon (want $want_anon), tokened publish $got_tok (want 201), bench fan-out 1x1 x 200 events with the token: exit $rc -> $ok"
  stop_gateway
}

# run_one WORKLOAD VARIANT ROUND: one gateway process, one bench run.
run_one() {
  local workload=$1 variant=$2 round=$3
  local name="$workload-$variant.r$round"
  start_gateway "$variant" "$name"
  if [[ -z $ADDR ]]; then echo 2 >"$OUT/$name.rc"; return 0; fi
  local u="http://$ADDR/v1/streams/{stream}" args=() flags=()
  mapfile -t flags < <(token_flags "$variant")
  case $workload in
    seq1 | seq64)
      args=(durable --publish-url "$u/events" --publishers "${workload#seq}" --payload-bytes 300
        --secs-per-run "$SECS" --target-pid "$GW_PID" --json) ;;
    pipe16 | rate50k)
      args=(fanout --streams 1 --subscribers-per-stream 0 --publishers 1 --pipeline-depth 16
        --payload-bytes 300 --events-per-stream $((SECS * 2000000)) --publish-secs-max "$SECS"
        --publish-url "$u/events" --publish-batch-url "$u/events:batch" --subscribe-url "$u"
        --publish-style gateway --id-style gateway --target-pid "$GW_PID" --label "$variant"
        --json)
      if [[ $workload == rate50k ]]; then args+=(--rate-events-per-sec 50000); fi ;;
  esac
  # $OUT/$name.json/.err/.rc; notes a gone gateway; a nonzero exit sets STATUS=1
  run_bench "$name" "$OUT/$name" $((SECS * 3 + 60)) "${args[@]}" "${flags[@]}"
  if kill -0 "$GW_PID" 2>/dev/null; then # the noise gauge, just before the gateway is stopped
    cat /proc/"$GW_PID"/task/*/schedstat 2>/dev/null | awk '{ s += $2 } END { print s / 1e9 }' \
      >"$OUT/$name.wait" || true
  fi
  stop_gateway
  rm -rf "$WORK/data-$name"
}

for v in "${VARIANTS[@]}"; do check "$v"; done
for round in $(seq 1 "$ROUNDS"); do
  order=("${VARIANTS[@]}")
  if ((round % 2 == 0)); then order=("${REVERSED[@]}"); fi
  for workload in "${WORKLOADS[@]}"; do
    for variant in "${order[@]}"; do
      run_one "$workload" "$variant" "$round"
    done
  done
done
run_log "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

echo
python3 - "$OUT" "$ROUNDS" "${VARIANTS[*]}" "${WORKLOADS[*]}" <<'PY' | tee "$OUT/table.md"
import json, statistics, sys

out, rounds = sys.argv[1], int(sys.argv[2])
variants = sys.argv[3].split()
titles = {
    "seq1": "1 sequential publisher (one POST in flight)",
    "seq64": "64 sequential publishers",
    "pipe16": "1 publisher, pipeline depth 16",
    "rate50k": "1 publisher, pipeline depth 16, held at 50,000 publishes/s",
}
workloads = {w: titles[w] for w in sys.argv[4].split()}

def load(workload, variant, r):
    """(CPU µs per publish, publishes/s, publish p50 ms or None) of one run, or Nones."""
    try:
        with open(f"{out}/{workload}-{variant}.r{r}.json") as f:
            doc = json.load(f)
        if workload.startswith("seq"):
            row = doc["rows"][0]
            if row["errors"]:
                return None, None, None
            return row["server_cpu_us_per_event"], row["events_per_sec"], row["latency"]["p50_ms"]
        rep = doc["reports"][-1]
        if rep["publish_errors"] or not rep["published"]:
            return None, None, None
        cpu = rep["server"]["cpu_secs"] * 1e6 / rep["published"]
        return cpu, rep["published"] / rep["window_secs"], None
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None, None, None

def wait(workload, variant, r):
    try:
        with open(f"{out}/{workload}-{variant}.r{r}.wait") as f:
            return float(f.read())
    except (OSError, ValueError):
        return None

def med(vals):
    got = [v for v in vals if v is not None]
    return statistics.median(got) if got else None

def fmt(v, digits):
    return "—" if v is None else f"{v:,.{digits}f}"

def ratio(a, b):
    return "—" if a is None or not b else f"{a / b:.3f}"

print(f"Rounds: {rounds} (odd rounds {'→'.join(variants)}, even rounds reversed); one fresh "
      "gateway per run. CPU = gateway utime+stime over the run / publishes answered (201). "
      "paired = median over rounds of that round's ratio (the runs of one round ran back to back).")
print()
print("| workload | variant | CPU µs / publish, per round | median | spread | publishes/s (median) | publish p50 ms (median) | gateway run-queue wait s (median; noise) |")
print("|---|---|---|---:|---:|---:|---:|---:|")
cpu = {}
for w, title in workloads.items():
    for v in variants:
        runs = [load(w, v, r) for r in range(1, rounds + 1)]
        c = [x[0] for x in runs]
        cpu[(w, v)] = c
        m = med(c)
        got = [x for x in c if x is not None]
        spread = f"{(max(got) - min(got)) / m:.0%}" if len(got) > 1 and m else "—"
        print(f"| {title if v == variants[0] else ''} | {v} | {' / '.join(fmt(x, 2) for x in c)} "
              f"| **{fmt(m, 2)}** | {spread} | {fmt(med([x[1] for x in runs]), 0)} "
              f"| {fmt(med([x[2] for x in runs]), 3)} "
              f"| {fmt(med([wait(w, v, r) for r in range(1, rounds + 1)]), 2)} |")
print()
print("Ratios of the CPU-per-publish medians (paired: median of per-round ratios). Target: "
      "hs256/anon and es256/anon ≤ 1.10.")
print()
extra = "anontok" in variants
print("| workload | hs256 / anon | es256 / anon | anon / none | paired hs256/anon | paired es256/anon | paired anon/none |"
      + (" anontok / anon | paired anontok/anon |" if extra else ""))
print("|---|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if extra else ""))
for w, title in workloads.items():
    def paired(a, b):
        rs = [x / y for x, y in zip(cpu.get((w, a), []), cpu.get((w, b), []))
              if x is not None and y]
        return f"{statistics.median(rs):.3f}" if rs else "—"
    m = {v: med(cpu.get((w, v), [])) for v in ("anon", "anontok", "hs256", "es256", "none")}
    print(f"| {title} | **{ratio(m['hs256'], m['anon'])}** | **{ratio(m['es256'], m['anon'])}** "
          f"| {ratio(m['anon'], m['none'])} | {paired('hs256', 'anon')} | {paired('es256', 'anon')} "
          f"| {paired('anon', 'none')} |"
          + (f" {ratio(m['anontok'], m['anon'])} | {paired('anontok', 'anon')} |" if extra else ""))
PY
echo
echo "results: $OUT"
exit "$STATUS"
