#!/usr/bin/env bash
# Installs cargo-fuzz (the `cargo fuzz` subcommand that builds and runs fuzz/'s libFuzzer
# targets) into .tools/cargo-fuzz/bin from crates.io, pinned and with its own lock file
# (`cargo install --locked`). Idempotent: nothing is done when that binary already reports the
# pinned version (a fresh clone builds it once: about a minute of CPU).
# Prints the binary's directory on its last line: `PATH="$(bash scripts/setup-fuzz.sh | tail -1):$PATH"`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/cargo-tool.sh
# 0.13.2: the version fuzz/README.md's runs used. --debug: cargo-fuzz only drives cargo and
# the fuzz binaries, nothing in it is hot; its debug build took 49 s of CPU against 88 s for
# release (one core, 2026-12-04).
bin=$(cargo_tool cargo-fuzz 0.13.2 --debug)
echo "${bin%/*}"
