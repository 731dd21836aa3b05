#!/usr/bin/env bash
# Supply-chain checks of the workspace's dependency graph with cargo-deny against deny.toml:
# licenses, bans (one version per crate, except the argued skips), sources (crates.io only),
# and advisories (RustSec) when a local copy of the advisory database is present.
# A stage of scripts/test.sh; cargo-deny is installed into .tools/ on first use (setup-deny.sh).
#
#   bash scripts/deny.sh
#   ADVISORY_DB=/path/to/advisory-db bash scripts/deny.sh   (a git checkout of RustSec's db)
#
# The advisory database is a git repository that cargo-deny clones from github.com; machines
# without that access (this project's, and CI's) have no copy. cargo-deny has no flag to skip
# a missing database (0.20 dropped --disable-fetch): with --offline it opens the copy under
# $CARGO_HOME/advisory-dbs and fails if there is none or it is older than 90 days, and
# without --offline it tries to clone. So this script runs advisories only when it finds a
# copy, and otherwise runs the other three checks and says plainly that advisories were NOT
# checked. Where it looks, in order:
#   $ADVISORY_DB                                          (given by hand)
#   $CARGO_HOME/advisory-dbs/advisory-db-3157b0e258782691 (cargo-deny's own: `cargo deny fetch`)
#   $HOME/.cargo/advisory-db                              (cargo-audit's)
# A copy found elsewhere than cargo-deny's own place is linked into .tools/cargo-deny/ and
# read from there; nothing is downloaded and nothing is written outside the repository.
set -euo pipefail
cd "$(dirname "$0")/.."

deny=$(bash scripts/setup-deny.sh | tail -1)
cargo_home=${CARGO_HOME:-$HOME/.cargo}
# cargo-deny names a database's directory after its URL: `advisory-db-` and the XxHash64 of
# https://github.com/rustsec/advisory-db (deny.toml keeps the default db-urls).
db_name=advisory-db-3157b0e258782691

is_db() { [[ -d $1/crates && -e $1/.git ]]; }

db="" config=deny.toml
if [[ -n ${ADVISORY_DB:-} ]]; then
  is_db "$ADVISORY_DB" || { echo "deny: FATAL: ADVISORY_DB=$ADVISORY_DB is not a git checkout of the advisory database (no crates/ or .git)" >&2; exit 1; }
  db=$ADVISORY_DB
elif is_db "$cargo_home/advisory-dbs/$db_name"; then
  db=$cargo_home/advisory-dbs/$db_name
elif is_db "$HOME/.cargo/advisory-db"; then
  db=$HOME/.cargo/advisory-db
fi
if [[ -n $db && $db != "$cargo_home/advisory-dbs/$db_name" ]]; then
  # deny.toml's db-path (the root of the databases) cannot be given on the command line:
  # read a copy of deny.toml that points it at .tools/cargo-deny/advisory-dbs.
  root=$PWD/.tools/cargo-deny/advisory-dbs
  mkdir -p "$root"
  ln -sfn "$(cd "$db" && pwd)" "$root/$db_name"
  config=.tools/cargo-deny/deny-local-db.toml
  sed "s|^\[advisories\]\$|[advisories]\ndb-path = \"$root\"|" deny.toml >"$config"
fi

# cargo-deny reads `cargo metadata` of every target; with --frozen it reads only what is
# already downloaded, so fetch first (crates.io is reachable; --locked: the lock file as is).
cargo fetch --locked --quiet

# A skip in deny.toml that no longer matches a duplicate is an error, not a warning: the list
# is of today's duplicates and shrinks as the dependencies catch up.
strict=(-D unmatched-skip -D unnecessary-skip)
if [[ -n $db ]]; then
  echo "deny: advisory database: $db (last commit $(git -C "$db" log -1 --format=%cs 2>/dev/null || echo '?'))"
  "$deny" --frozen --config "$config" check --show-stats "${strict[@]}" advisories bans licenses sources
  echo "deny: advisories, bans, licenses, sources checked"
else
  "$deny" --frozen --config "$config" check --show-stats "${strict[@]}" bans licenses sources
  echo "deny: bans, licenses, sources checked"
  echo "deny: NOTE: advisories were NOT checked: no local copy of the RustSec advisory database"
  echo "      (looked for \$ADVISORY_DB, $cargo_home/advisory-dbs/$db_name, $HOME/.cargo/advisory-db;"
  echo "      cargo-deny fetches it from github.com, which this machine cannot reach)"
fi
