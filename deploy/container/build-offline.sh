#!/usr/bin/env bash
# Builds the runtime image WITHOUT pulling a base image (for machines that cannot reach a
# container registry): the host's release binary and the shared libraries it links, on
# `FROM scratch`, with the same user, volume, ports and entrypoint as ../../Containerfile's
# runtime stage. Usage: deploy/container/build-offline.sh [TAG]   (default sse-gateway:offline)
set -euo pipefail
cd "$(dirname "$0")/../.."
tag=${1:-sse-gateway:offline}
cargo build --release --locked -p gateway
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
install -D -m 0755 target/release/gateway "$ctx/root/usr/local/bin/gateway"
# The dynamic loader and every library ldd names, at the same paths.
for lib in $(ldd target/release/gateway | grep -oE '/[^ ]+'); do
  install -D -m 0755 "$lib" "$ctx/root$lib"
done
mkdir -p "$ctx/root/etc/gateway" "$ctx/root/var/lib/gateway" "$ctx/root/tmp"
echo 'gateway:x:999:999:gateway:/var/lib/gateway:/usr/sbin/nologin' >"$ctx/root/etc/passwd"
echo 'gateway:x:999:' >"$ctx/root/etc/group"
cat >"$ctx/Containerfile" <<'CF'
FROM scratch
COPY --chown=999:999 root/ /
USER 999:999
VOLUME ["/var/lib/gateway"]
EXPOSE 8080 9090
ENV GATEWAY_ADMIN_LISTEN=0.0.0.0:9090
ENTRYPOINT ["/usr/local/bin/gateway", "--config", "/etc/gateway/gateway.toml", "--data-dir", "/var/lib/gateway"]
CF
podman build -t "$tag" -f "$ctx/Containerfile" "$ctx"
