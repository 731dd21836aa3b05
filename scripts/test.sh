#!/usr/bin/env bash
# The project's one test command (README "Test"): format check, clippy with -D warnings,
# then every test in the workspace. Later stages (MCP conformance) are added here as they land.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== cargo fmt --check"
cargo fmt --all --check

echo "== cargo clippy -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings

echo "== tests"
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --locked --no-fail-fast
else
  cargo test --workspace --locked --no-fail-fast
fi
cargo test --workspace --locked --doc
