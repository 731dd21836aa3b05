#!/usr/bin/env bash
# Installs the JavaScript/Python toolchain the MCP tests need, locally inside the repository:
#   .tools/node22/     Node 22 from the npm package `node@22` (Node 20 cannot run the conformance
#                      suite: it needs fs.globSync)
#   mcp-fixture/node_modules, mcp-tests/node_modules   from their committed package-lock.json (npm ci)
#   .tools/venv/       a Python venv with the `mcp` client from PyPI (only with --python)
# Everything comes from the npm registry / PyPI by package name; nothing else is downloaded.
# Idempotent: each step is skipped when its stamp matches the inputs (quick when installed).
# Prints the PATH prefix to use on its last line: `export PATH="$(scripts/setup-node.sh | tail -1):$PATH"`.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
NODE_VERSION=22.23.3          # pinned: the npm package `node@22.23.3`
MCP_PY_VERSION=1.27.1         # pinned: PyPI `mcp` (1.x client API: streamablehttp_client)
TOOLS=$ROOT/.tools
WANT_PYTHON=0
for arg in "$@"; do
  case "$arg" in
    --python) WANT_PYTHON=1 ;;
    *) echo "setup-node.sh: unknown argument '$arg' (known: --python)" >&2; exit 2 ;;
  esac
done

log() { echo "setup-node: $*" >&2; }
need() { command -v "$1" >/dev/null 2>&1 || { log "FATAL: '$1' not found on PATH (needed to $2)"; exit 1; }; }
need npm "install node@22 from the npm registry"

# 1. Node 22 (npm package `node`, which ships the official binary for this platform).
NODE_DIR=$TOOLS/node22
NODE_BIN=$NODE_DIR/node_modules/.bin
if [[ -x $NODE_BIN/node ]] && [[ "$("$NODE_BIN/node" --version 2>/dev/null)" == "v$NODE_VERSION" ]]; then
  log "node v$NODE_VERSION already installed"
else
  log "installing node@$NODE_VERSION into $NODE_DIR"
  mkdir -p "$NODE_DIR"
  [[ -f $NODE_DIR/package.json ]] || echo '{"name":"node22-tool","private":true}' > "$NODE_DIR/package.json"
  npm install --prefix "$NODE_DIR" --no-audit --no-fund --loglevel=error "node@$NODE_VERSION" >&2
  got=$("$NODE_BIN/node" --version 2>/dev/null || true)
  [[ $got == "v$NODE_VERSION" ]] || { log "FATAL: node@$NODE_VERSION install did not produce a working binary (got '$got')"; exit 1; }
fi
export PATH=$NODE_BIN:$PATH

# 2. npm deps of the fixture and the tests, from their lockfiles. The stamp is the lockfile hash.
npm_ci() {
  local dir=$1
  [[ -f $dir/package-lock.json ]] || { log "FATAL: $dir/package-lock.json missing (run npm install there and commit it)"; exit 1; }
  local want have
  want=$(sha256sum "$dir/package-lock.json" | cut -d' ' -f1)
  have=$(cat "$dir/node_modules/.setup-stamp" 2>/dev/null || true)
  if [[ $want == "$have" ]]; then
    log "$dir deps up to date"
  else
    log "npm ci in $dir"
    (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error >&2)
    echo "$want" > "$dir/node_modules/.setup-stamp"
  fi
}
npm_ci mcp-fixture
npm_ci mcp-tests

# 3. Optional: Python venv with the official `mcp` client.
if [[ $WANT_PYTHON == 1 ]]; then
  need python3 "create the Python venv for the mcp client"
  VENV=$TOOLS/venv
  if [[ -x $VENV/bin/python ]] && "$VENV/bin/python" -c "import importlib.metadata as m,sys; sys.exit(m.version('mcp')!='$MCP_PY_VERSION')" 2>/dev/null; then
    log "python mcp==$MCP_PY_VERSION already installed"
  else
    log "installing python mcp==$MCP_PY_VERSION into $VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "mcp==$MCP_PY_VERSION" >&2
  fi
fi

echo "$NODE_BIN"
