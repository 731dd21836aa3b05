#!/usr/bin/env bash
# Installs Debian's headless-capable Chromium for the real-browser test
# (gateway/tests/browser.rs: EventSource + CORS + Last-Event-ID resume through a cutting proxy).
# Idempotent: does nothing when `chromium` is already on PATH and starts. Needs root (apt-get)
# only when it has to install. Everything comes from Debian's packages by name.
# Prints the chromium path on its last line: `export CHROMIUM="$(bash scripts/setup-browser.sh | tail -1)"`.
set -euo pipefail

log() { echo "setup-browser: $*" >&2; }
die() {
  log "FATAL: $*"
  log "the browser test (gateway/tests/browser.rs) needs Debian's chromium; install it by hand"
  log "(apt-get update && apt-get install -y --no-install-recommends chromium fonts-dejavu-core)"
  log "or set GATEWAY_TESTS_WITHOUT_BROWSER=1 to skip that test (it then prints SKIPPED)"
  exit 1
}

# A browser that `--version` cannot even start is as good as none.
works() { "$1" --headless=new --no-sandbox --disable-gpu --version >/dev/null 2>&1; }

path=$(command -v chromium || true)
if [[ -n $path ]] && works "$path"; then
  log "chromium already installed: $("$path" --version 2>/dev/null)"
else
  command -v apt-get >/dev/null 2>&1 || die "chromium is not on PATH and apt-get is not available"
  [[ $(id -u) -eq 0 ]] || die "chromium is not on PATH and installing it needs root (apt-get)"
  log "installing chromium from Debian's packages"
  export DEBIAN_FRONTEND=noninteractive
  # Quiet on success; the output is shown when a step fails.
  out=$(mktemp)
  trap 'rm -f "$out"' EXIT
  apt-get update >"$out" 2>&1 || { cat "$out" >&2; die "apt-get update failed"; }
  # chromium pulls its shared libraries; a font is needed for any page to lay out text
  # (without one headless chromium logs fontconfig errors and may fail to render).
  apt-get install -y --no-install-recommends chromium fonts-dejavu-core >"$out" 2>&1 \
    || { cat "$out" >&2; die "apt-get install chromium failed"; }
  path=$(command -v chromium || true)
  [[ -n $path ]] || die "apt-get installed chromium but it is not on PATH"
  works "$path" \
    || die "$path was installed but does not start ('$path --headless=new --no-sandbox --version')"
  log "installed $("$path" --version 2>/dev/null)"
fi
echo "$path"
