#!/usr/bin/env bash
# Installs cargo-deny (licenses, bans, sources and advisories of the dependency graph against
# deny.toml; scripts/deny.sh runs it) into .tools/cargo-deny/bin from crates.io, pinned and with
# its own lock file (`cargo install --locked`). Idempotent: nothing is done when that binary
# already reports the pinned version (a fresh clone builds it once: several minutes on 2 cores).
# Prints the binary's path on its last line.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=0.20.2          # needs Rust >= 1.88; builds with the project's 1.95
ROOT=$PWD/.tools/cargo-deny
BIN=$ROOT/bin/cargo-deny

log() { echo "setup-deny: $*" >&2; }
have() { [[ -x $BIN ]] && [[ "$("$BIN" --version 2>/dev/null)" == "cargo-deny $VERSION" ]]; }

if have; then
  log "cargo-deny $VERSION already installed ($BIN)"
else
  log "installing cargo-deny $VERSION into $ROOT (cargo install --locked, from crates.io)"
  out=$(mktemp)
  trap 'rm -f "$out"' EXIT
  # cargo-deny's release profile is fat LTO with one codegen unit: about twice the build time
  # on 2 cores for a tool that then runs for seconds, so the install turns both off.
  CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 \
    cargo install --locked --quiet "cargo-deny@$VERSION" --root "$ROOT" >"$out" 2>&1 \
    || { cat "$out" >&2; log "FATAL: cargo install cargo-deny@$VERSION failed"; exit 1; }
  have || { log "FATAL: $BIN does not report cargo-deny $VERSION after the install"; exit 1; }
fi
echo "$BIN"
