#!/usr/bin/env bash
# Installs cargo-deny (licenses, bans, sources and advisories of the dependency graph against
# deny.toml; scripts/deny.sh runs it) into .tools/cargo-deny/bin from crates.io, pinned and with
# its own lock file (`cargo install --locked`). Idempotent: nothing is done when that binary
# already reports the pinned version (a fresh clone builds it once: about 4 minutes on the
# shared 2 cores). Prints the binary's path on its last line.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/cargo-tool.sh
# 0.20.2 needs Rust >= 1.88 and builds with the project's 1.95. Its release profile is fat LTO
# with one codegen unit: about twice the build time for a tool that then runs for seconds, so
# the install turns both off.
CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 \
  cargo_tool cargo-deny 0.20.2
