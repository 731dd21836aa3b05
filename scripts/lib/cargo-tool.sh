# shellcheck shell=bash
# cargo-tool.sh: installs a pinned cargo subcommand from crates.io into the repository's
# .tools/, for setup-deny.sh and setup-fuzz.sh. Sourced, never run; it only defines a function,
# so it is safe under the caller's `set -euo pipefail`:
#   source "$(dirname "$0")/lib/cargo-tool.sh"

# cargo_tool NAME VERSION [CARGO_INSTALL_OPTION...]: makes sure .tools/NAME/bin/NAME (below
# the current directory, the repository root) is crates.io's NAME at VERSION, installing it
# with `cargo install --locked` (the tool's own lock file) when it is absent or another
# version; prints the binary's path. Progress goes to stderr; a failed install shows cargo's
# output and exits 1.
cargo_tool() {
  local name=$1 version=$2
  shift 2
  local root=$PWD/.tools/$name
  local bin=$root/bin/$name
  if [[ -x $bin && "$("$bin" --version 2>/dev/null)" == "$name $version" ]]; then
    echo "setup: $name $version already installed ($bin)" >&2
  else
    echo "setup: installing $name $version into $root (cargo install --locked, from crates.io)" >&2
    local out
    out=$(mktemp)
    if ! cargo install --locked --quiet "$@" "$name@$version" --root "$root" >"$out" 2>&1; then
      cat "$out" >&2
      rm -f "$out"
      echo "setup: FATAL: cargo install $name@$version failed" >&2
      exit 1
    fi
    rm -f "$out"
    [[ "$("$bin" --version 2>/dev/null)" == "$name $version" ]] \
      || { echo "setup: FATAL: $bin does not report $name $version after the install" >&2; exit 1; }
  fi
  echo "$bin"
}
