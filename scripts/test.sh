#!/usr/bin/env bash
# The project's one test command (README "Commands"): format check, clippy with -D warnings,
# doc tests, then every test in the workspace (nextest's summary is the closing line).
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== cargo fmt --check"
cargo fmt --all --check

echo "== cargo clippy -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings

echo "== doc tests"
cargo test --workspace --locked --doc

echo "== tests"
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --locked --no-fail-fast
else
  cargo test --workspace --locked --no-fail-fast
fi
