#!/usr/bin/env bash
# Installs the operator tools the deployment tests run (gateway/tests/deploy.rs):
#   promtool          from Debian's `prometheus` package, extracted into .tools/prometheus/
#                     (apt-get download + dpkg-deb -x: no service is installed or started)
#   systemd-analyze   from Debian's `systemd` package (apt-get install, when missing)
# Idempotent. Needs root only when it has to install (apt-get). Prints two lines last:
#   PROMTOOL=<path>
#   SYSTEMD_ANALYZE=<path>
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
log() { echo "setup-ops: $*" >&2; }
die() { log "FATAL: $*"; exit 1; }

apt_updated=0
apt_update() {
  [[ $apt_updated -eq 1 ]] && return 0
  [[ $(id -u) -eq 0 ]] || die "installing needs root (apt-get)"
  apt-get update >/dev/null 2>&1 || die "apt-get update failed"
  apt_updated=1
}

promtool=$ROOT/.tools/prometheus/usr/bin/promtool
if ! "$promtool" --version >/dev/null 2>&1; then
  command -v apt-get >/dev/null 2>&1 || die "apt-get is not available to fetch promtool"
  apt_update
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && apt-get download prometheus >/dev/null 2>&1) || die "apt-get download prometheus failed"
  rm -rf "$ROOT/.tools/prometheus"
  mkdir -p "$ROOT/.tools/prometheus"
  dpkg-deb -x "$tmp"/prometheus_*.deb "$ROOT/.tools/prometheus" || die "dpkg-deb -x failed"
  "$promtool" --version >/dev/null 2>&1 || die "$promtool does not run"
  log "promtool installed: $("$promtool" --version 2>&1 | head -1)"
fi

analyze=$(command -v systemd-analyze || true)
if [[ -z $analyze ]]; then
  command -v apt-get >/dev/null 2>&1 || die "systemd-analyze is missing and apt-get is not available"
  apt_update
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends systemd >/dev/null 2>&1 \
    || die "apt-get install systemd failed"
  analyze=$(command -v systemd-analyze) || die "systemd was installed but systemd-analyze is not on PATH"
fi

echo "PROMTOOL=$promtool"
echo "SYSTEMD_ANALYZE=$analyze"
