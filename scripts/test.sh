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

echo "== MCP front: conformance suite + exactly-once tests with the official clients"
# Installs Node 22 / npm deps / the Python mcp client locally (.tools/, from npm and PyPI) on
# first use; a failed install fails the run here, loudly.
if ! bash scripts/conformance.sh; then
  echo "FAILED: scripts/conformance.sh (MCP setup, conformance suite or client tests); see above" >&2
  exit 1
fi
