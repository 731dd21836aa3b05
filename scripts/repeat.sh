#!/usr/bin/env bash
# Runs the test command N times and prints, per test, how many runs it failed in: a test that
# fails one run in N is a defect (DEVELOPERS guide, "Tests that pass every time").
#
#   bash scripts/repeat.sh N                 # N runs of the README's test command (scripts/test.sh)
#   bash scripts/repeat.sh N FILTER...       # N runs of `cargo nextest run` with these filter
#                                            # arguments only (after the same browser, cluster
#                                            # and operator-tools setup), e.g. `-p gateway --test browser_tls`
#
# Each run's output is kept in $REPEAT_LOGS (default: a new directory under /tmp, printed).
# The random tests print their seeds: grep a failed run's log for "seed" to replay it. Exits 1
# when any run failed.
set -uo pipefail
cd "$(dirname "$0")/.."
n="${1:?usage: scripts/repeat.sh N [nextest filter arguments...]}"
shift
logs="${REPEAT_LOGS:-$(mktemp -d /tmp/repeat.XXXXXX)}"
mkdir -p "$logs"
echo "repeat: $n runs, logs in $logs"

if [ $# -gt 0 ]; then
  CHROMIUM=$(bash scripts/setup-browser.sh | tail -1); export CHROMIUM
  cluster_env=$(bash scripts/setup-cluster.sh | tail -2)
  export "${cluster_env%%$'\n'*}" "${cluster_env##*$'\n'}"
  ops_env=$(bash scripts/setup-ops.sh | tail -2)
  export "${ops_env%%$'\n'*}" "${ops_env##*$'\n'}"
fi

failed_runs=0
for i in $(seq 1 "$n"); do
  log="$logs/run-$i.log"
  start=$(date +%s)
  if [ $# -gt 0 ]; then
    cargo nextest run --locked --no-fail-fast "$@" >"$log" 2>&1
  else
    bash scripts/test.sh >"$log" 2>&1
  fi
  rc=$?
  secs=$(($(date +%s) - start))
  # nextest's result lines: "        FAIL [  11.357s] (1/1) gateway::browser_tls name"
  fails=$(grep -E '^\s+(FAIL|SIGSEGV|SIGABRT|TIMEOUT) \[' "$log" | sed -E 's/^.*\] (\([0-9/ ]+\) )?//' | sort -u)
  if [ "$rc" -ne 0 ]; then
    failed_runs=$((failed_runs + 1))
    [ -z "$fails" ] && fails="(a stage before or after the tests failed: see $log)"
    echo "run $i: FAILED in ${secs}s"
    printf '%s\n' "$fails" | sed 's/^/    /' | tee -a "$logs/failures"
  else
    echo "run $i: passed in ${secs}s"
  fi
done

echo "== failures per test over $n runs"
if [ -s "$logs/failures" ]; then
  sed 's/^    //' "$logs/failures" | sort | uniq -c | sort -rn | awk -v n="$n" '{ c = $1; $1 = ""; printf "%3d/%d %s\n", c, n, $0 }'
else
  echo "none"
fi
echo "repeat: $((n - failed_runs)) of $n runs passed"
[ "$failed_runs" -eq 0 ]
