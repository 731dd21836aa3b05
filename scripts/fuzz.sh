#!/usr/bin/env bash
# Runs every cargo-fuzz target (fuzz/README.md) for N seconds each, one at a time, pinned to
# one CPU. Not part of the CI test command (scripts/test.sh): fuzzing needs nightly-only
# sanitizer flags, which we enable on the stable toolchain with RUSTC_BOOTSTRAP=1.
#
#   bash scripts/fuzz.sh [SECONDS_PER_TARGET=60] [TARGET...]
#   FUZZ_CPU=1 (cpu to pin to)
# Corpora live in fuzz/corpus/<target> (git-ignored), crashes in fuzz/artifacts/<target>.
set -uo pipefail
cd "$(dirname "$0")/../fuzz"
secs="${1:-60}"
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(event_id http_head batch_body sse_frame log_recovery log_forged)
fi
cpu="${FUZZ_CPU:-1}"
export RUSTC_BOOTSTRAP=1
cargo fuzz build -O -a || exit 1
failed=()
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t"
  seeds=()
  if [ -d "seeds/$t" ]; then seeds=("seeds/$t"); fi
  echo "== $t: ${secs}s on cpu $cpu"
  taskset -c "$cpu" cargo fuzz run -O -a "$t" "corpus/$t" "${seeds[@]}" -- \
    -max_total_time="$secs" -print_final_stats=1 -rss_limit_mb=2048 -timeout=10 || failed+=("$t")
  # Targets keep a scratch log in /dev/shm (or /tmp) for the whole process; libFuzzer exits
  # without running destructors, so remove what this run left behind.
  rm -rf /dev/shm/fuzz-sse-frame* /dev/shm/fuzz-recovery* /dev/shm/fuzz-forged* \
    /tmp/fuzz-sse-frame* /tmp/fuzz-recovery* /tmp/fuzz-forged*
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: crashes in: ${failed[*]} (see fuzz/artifacts/)"
  exit 1
fi
echo "fuzz: no crash"
