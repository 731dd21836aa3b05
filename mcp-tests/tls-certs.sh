#!/usr/bin/env bash
# Generates a throwaway test CA and a server certificate for 127.0.0.1 with the openssl CLI
# (ECDSA P-256, valid 2 days), for the HTTPS run of mcp-tests/exactly-once.mjs. Nothing of this
# is committed: the files go to DIR (created; use a run's temp dir):
#   DIR/ca.pem       the CA certificate: the client trusts it via NODE_EXTRA_CA_CERTS
#   DIR/ca.key       the CA's key (only used here, to sign)
#   DIR/server.pem   the server certificate (SAN IP:127.0.0.1, serverAuth), signed by the CA
#   DIR/server.key   its key (PKCS#8 PEM): --tls-key-file
# Prints, on stdout, the environment exactly-once.mjs --https reads:
#   MCP_TLS_CERT_FILE=... MCP_TLS_KEY_FILE=... NODE_EXTRA_CA_CERTS=...
# Usage: bash mcp-tests/tls-certs.sh DIR
#        env $(bash mcp-tests/tls-certs.sh /tmp/eo-tls) node mcp-tests/exactly-once.mjs --https
set -euo pipefail
[[ $# == 1 ]] || { echo "usage: $0 DIR" >&2; exit 2; }
command -v openssl >/dev/null 2>&1 || { echo "tls-certs.sh: 'openssl' not found on PATH" >&2; exit 1; }
DIR=$1
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
LOG=$DIR/openssl.log
: >"$LOG"
run() { "$@" >>"$LOG" 2>&1 || { cat "$LOG" >&2; echo "tls-certs.sh: failed: $*" >&2; exit 1; }; }

run openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
  -keyout "$DIR/ca.key" -out "$DIR/ca.pem" -days 2 \
  -subj "/CN=sse-gateway exactly-once test CA $(date +%s)-$$" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
run openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
  -keyout "$DIR/server.key" -out "$DIR/server.csr" -subj "/CN=127.0.0.1"
cat >"$DIR/server.ext" <<'EOF'
subjectAltName=IP:127.0.0.1
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth
subjectKeyIdentifier=hash
authorityKeyIdentifier=keyid
EOF
run openssl x509 -req -in "$DIR/server.csr" -CA "$DIR/ca.pem" -CAkey "$DIR/ca.key" \
  -set_serial "0x$(openssl rand -hex 8)" -days 2 -extfile "$DIR/server.ext" -out "$DIR/server.pem"
run openssl verify -CAfile "$DIR/ca.pem" "$DIR/server.pem"
chmod 600 "$DIR/ca.key" "$DIR/server.key"

echo "MCP_TLS_CERT_FILE=$DIR/server.pem MCP_TLS_KEY_FILE=$DIR/server.key NODE_EXTRA_CA_CERTS=$DIR/ca.pem"
