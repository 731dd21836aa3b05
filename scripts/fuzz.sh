#!/usr/bin/env bash
# Runs every cargo-fuzz target (fuzz/README.md) for N seconds each, one at a time, pinned to
# one CPU. Fuzzing needs nightly-only sanitizer flags, which we enable on the stable toolchain
# with RUSTC_BOOTSTRAP=1. cargo-fuzz is installed into .tools/ on first use (setup-fuzz.sh).
#
#   bash scripts/fuzz.sh [SECONDS_PER_TARGET=60] [TARGET...]
#   bash scripts/fuzz.sh --ci [SECONDS_PER_TARGET=20] [TARGET...]
#   FUZZ_CPU=1 (cpu to pin to)
# Corpora live in fuzz/corpus/<target> (git-ignored), crashes in fuzz/artifacts/<target>.
# --ci (the test command's stage, scripts/test.sh): each target starts from its committed
# fuzz/seeds/<target> only, in a scratch corpus (neither reads nor grows fuzz/corpus), and the
# run fails if any target crashes, leaks, times out or runs out of memory.
# Each target's last line is `<target>: N execs in S s` (N from libFuzzer's final stats, S the
# wall time of that target's run, start-up and corpus loading included).
set -uo pipefail
cd "$(dirname "$0")/.."
ci=0
if [ "${1:-}" = "--ci" ]; then
  ci=1
  shift
fi
secs="${1:-$([ $ci = 1 ] && echo 20 || echo 60)}"
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  # Every [[bin]] of fuzz/Cargo.toml (the package's own name excluded): a new target runs
  # without being listed here.
  mapfile -t targets < <(sed -n 's/^name = "\(.*\)"$/\1/p' fuzz/Cargo.toml | grep -vx 'sse-gateway-fuzz')
fi
cpu="${FUZZ_CPU:-1}"
# A machine with one CPU has only cpu 0.
[ "$cpu" -lt "$(nproc)" ] || cpu=0

fuzz_bin=$(bash scripts/setup-fuzz.sh | tail -1) || exit 1
export PATH="$fuzz_bin:$PATH"
cd fuzz
export RUSTC_BOOTSTRAP=1
build_start=$SECONDS
cargo fuzz build -O -a || exit 1
echo "fuzz: targets built in $((SECONDS - build_start)) s"

scratch=""
if [ $ci = 1 ]; then
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' EXIT
fi
failed=()
total=0
for t in "${targets[@]}"; do
  if [ $ci = 1 ]; then
    corpus="$scratch/$t"
  else
    corpus="corpus/$t"
  fi
  mkdir -p "$corpus"
  seeds=()
  if [ -d "seeds/$t" ]; then seeds=("seeds/$t"); fi
  echo "== $t: ${secs}s on cpu $cpu (seeds: ${seeds[*]:-none})"
  log=$(mktemp)
  start=$SECONDS
  run=(taskset -c "$cpu" cargo fuzz run -O -a "$t" "$corpus" "${seeds[@]}" --
    -max_total_time="$secs" -print_final_stats=1 -rss_limit_mb=2048 -timeout=10)
  if [ $ci = 1 ]; then
    "${run[@]}" >"$log" 2>&1
    rc=$?
  else
    "${run[@]}" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
  fi
  took=$((SECONDS - start))
  execs=$(grep -Eo 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -Eo '[0-9]+$' | tail -1)
  # --ci keeps the log short: libFuzzer's start and final lines when the target holds; when
  # it fails, the report and libFuzzer's summary on (or the log's last 80 lines).
  if [ $ci = 1 ]; then
    if [ "$rc" -eq 0 ] && [ -n "$execs" ]; then
      grep -E '^INFO: seed corpus|^#[0-9]+[[:space:]]+(INITED|DONE)|^stat::(number_of_executed_units|average_exec_per_sec|new_units_added|peak_rss_mb)' "$log"
    elif grep -q '^SUMMARY: ' "$log"; then
      # The panic or sanitizer report, then from libFuzzer's summary on (the input, where it
      # was written, cargo fuzz's reproduce command).
      grep -E -A4 -m2 "panicked at|ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)" "$log" || true
      echo "..."
      sed -n '/^SUMMARY: /,$p' "$log"
    else
      tail -n 80 "$log"
    fi
  fi
  rm -f "$log"
  # Targets keep a scratch log in /dev/shm (or /tmp) for the whole process; libFuzzer exits
  # without running destructors, so remove what this run left behind.
  rm -rf /dev/shm/fuzz-sse-frame* /dev/shm/fuzz-recovery* /dev/shm/fuzz-forged* \
    /tmp/fuzz-sse-frame* /tmp/fuzz-recovery* /tmp/fuzz-forged*
  if [ "$rc" -ne 0 ] || [ -z "$execs" ]; then
    failed+=("$t")
    echo "$t: FAILED (exit $rc) after ${execs:-?} execs in $took s; the input is in fuzz/artifacts/$t/"
  else
    total=$((total + execs))
    echo "$t: $execs execs in $took s"
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: crashes in: ${failed[*]} (see fuzz/artifacts/; reproduce: cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run -O -a <target> artifacts/<target>/<file>)"
  exit 1
fi
echo "fuzz: no crash (${#targets[@]} targets, $total execs in all)"
