#!/usr/bin/env bash
# Shows that the simulator (sim/) has teeth: plants one-line bugs (mutants), one at a time, in a
# scratch copy of this tree under /tmp, runs the release simulator on each until its first
# violation (at most SIM_MUTANT_SEEDS seeds, default 20000, or SIM_MUTANT_SECS seconds, default
# 120), and prints `mutant NAME: found after K seeds` or `mutant NAME: NOT FOUND`. Never touches
# the checkout it is run from (the copy has its own target directory). Exit 1 if any mutant
# survives or does not apply. SIM_ARGS=--whole runs the whole-node simulator instead (the
# gateway's real per-core loop over a simulated kernel), and adds the mutants only a whole node
# can meet (in `gateway/src/core/`); SIM_MUTANTS="name ..." runs only those named.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
seeds_max=${SIM_MUTANT_SEEDS:-20000}
secs_max=${SIM_MUTANT_SECS:-120}
sim_args=${SIM_ARGS:-}
only=${SIM_MUTANTS:-}
scratch=$(mktemp -d /tmp/sim-mutants.XXXXXX)
trap 'rm -rf "$scratch"' EXIT

# The tree as it is (tracked and untracked files, not ignored ones), without its target.
git ls-files -co --exclude-standard -z | tar -c --null -T - | tar -x -C "$scratch/"
mkdir -p "$scratch/target"
# Registry crates built for release are reused when this checkout has them (paths match).
if [ -d "$root/target/release" ]; then cp -a "$root/target/release" "$scratch/target/"; fi
export CARGO_TARGET_DIR="$scratch/target"

# mutant NAME FILE SED-EXPRESSION: a one-line change of FILE.
failed=0
mutant() {
  local name=$1 file=$2 expr=$3
  if [ -n "$only" ] && ! tr ' ' '\n' <<<"$only" | grep -qxF -- "$name"; then return; fi
  cp "$root/$file" "$scratch/$file"
  sed -i -e "$expr" "$scratch/$file"
  if cmp -s "$root/$file" "$scratch/$file"; then
    echo "mutant $name: PATCH DID NOT APPLY to $file"; failed=1; return
  fi
  (cd "$scratch" && cargo build --release --quiet -p sim 2>&1 | tail -5)
  local out
  out=$("$scratch/target/release/sim" $sim_args --seeds "$seeds_max" --secs "$secs_max" --stop || true)
  cp "$root/$file" "$scratch/$file"
  local k why
  k=$(sed -n 's/^first violation after \([0-9]*\) seeds$/\1/p' <<<"$out")
  if [ -n "$k" ]; then
    why=$(grep -m1 '^VIOLATION' <<<"$out" | cut -c1-160)
    echo "mutant $name: found after $k seeds ($why)"
  else
    echo "mutant $name: NOT FOUND ($(tail -1 <<<"$out"))"; failed=1
  fi
}

# 1. The resume starts one event early (a replay from N instead of N+1: a duplicate).
mutant resume-off-by-one log-store/src/resume.rs \
  's/| Case::ReplayWindowBehind => ResumePlan::Replay { from: n + 1 },/| Case::ReplayWindowBehind => ResumePlan::Replay { from: n },/'
# 2. The send window releases what a send completion reports, not what the peer ACKed.
mutant window-release-on-send gateway/src/streams/window.rs \
  's/let hint = self.ack_hint;/let hint = self.sent;/'
# 3. A read returns events past the visible (durable) tail: shown before their fsync.
mutant shown-before-fsync log-store/src/log.rs \
  's/let end = (st.visible + 1 - st.floor) as usize;/let end = (st.tail + 1 - st.floor) as usize;/'
# 4. Recovery keeps a record whose CRC does not match (a torn write is taken for data).
mutant recovery-keeps-bad-crc log-store/src/format.rs \
  's/if crc == u32_at(b, 0) {/if crc == u32_at(b, 0) || !payload.is_empty() {/'
# 5. Windows are parked under one stream's key whatever their stream: a resume of that stream
#    may be served another stream's events.
mutant parked-wrong-stream gateway/src/streams/parked.rs \
  's/let list = self.by_stream.entry(key).or_default();/let list = self.by_stream.entry((key.0, log_store::StreamId(0))).or_default();/'
# 6. A batch is answered once its first event is durable, not its last.
mutant batch-answered-early gateway/src/streams/publish.rs \
  's/let wait = ids.last()/let wait = ids.first()/'
# 7. Recovery drops the key records it finds (an Idempotency-Key forgotten at a restart: a
#    retry of an answered publish would store it twice).
mutant recovery-drops-keys log-store/src/log/recover.rs \
  's/        self.keys.push(KeyRecord {/        Vec::new().push(KeyRecord {/'

# Only the whole node (SIM_ARGS=--whole) drives these: the per-core loop, the connection
# machine and the answers, which the log-level simulator replaces by calls of its own.
if [[ " $sim_args " == *" --whole "* ]]; then
  # 8. Publish answers leave at the end of any turn that touched a stream, durable or not.
  mutant answer-before-durable gateway/src/core/waits.rs \
    's/let released = h.release_waits(|w| hub.visible(w));/let released = h.release_waits(|_| true);/'
  # 8b. The answers a turn held for its end (Waits::hold_to_turn_end): the first is never sent.
  mutant held-answer-dropped gateway/src/core/waits.rs \
    's/for \&r in \&self.held {/for \&r in self.held.iter().skip(1) {/'
  # 9. A lost wake-up: the subscribers of streams that moved are not pumped.
  mutant lost-wakeup gateway/src/core/mod.rs \
    's/to_pump.extend_from_slice(self.hub.subscribers(key));/let _ = key;/'
  # 10. A subscriber's partial send is counted whole: the rest of its runs is skipped.
  mutant sub-partial-send-whole gateway/src/core/net/mod.rs \
    's/let n = res.max(0) as u64;/let n = if res < 0 { 0 } else { v.len() };/'
  # 11. An answer's partial send is counted whole: the rest of the answer is dropped.
  mutant answer-partial-send-whole gateway/src/proto/conn/outbox.rs \
    's/self.woff += n;/self.woff += self.sending;/'
  # 12. An MCP stream resumed with GET + Last-Event-ID starts one event late (the MCP front's
  #     own use of the resume plan, in mcp-front).
  mutant mcp-resume-off-by-one mcp-front/src/core/resume.rs \
    's/Some(aligned.map_or(from, |(head, _)| head))/Some(aligned.map_or(from + 1, |(head, _)| head))/'
  # 13. A resumed MCP response does not restate the client's position first (README: "a
  #     resumed response first restates that ID"; clients that lose it before the next event
  #     would resume without an ID).
  mutant mcp-no-restate mcp-front/src/core/resume.rs \
    's/            reprime: Some(at.ev.to_string()),/            reprime: None,/'
  # 14. Progress notifications are routed to the session's GET stream, not to the stream of
  #     the request whose progressToken they carry.
  mutant mcp-progress-misrouted mcp-front/src/core/routing.rs \
    's/.and_then(|t| sess.progress.get(\&t).copied()),/.and_then(|_| Some(0)),/'
  # 15. A Last-Event-ID of another session's stream is served (the ID's session is not
  #     checked): one session reads another's messages.
  mutant mcp-foreign-id-served mcp-front/src/core/resume.rs \
    's/            .filter(|(owner, _)| \*owner == sid)/            .filter(|_| true)/'
  # 16. A request with a session ID is served by the core it reached, not handed to the core
  #     that minted the session (the MCP front on every core): that core does not know it.
  mutant mcp-not-handed-over gateway/src/shards.rs \
    's/            (Some(sid), _) => core_of_shard(mcp_owner_shard(sid, self.shards), self.cores),/            (Some(_), _) => here % n,/'
  # 17. A failed syncfs round (--fsync-scope filesystem) is taken as a success: its shards'
  #     records become visible and their publishes are answered though nothing is durable.
  mutant syncfs-error-ignored gateway/src/streams/hub.rs \
    's/            took = Some(self.on_fsync(s, res, core, now));/            took = Some(self.on_fsync(s, res.max(0), core, now));/'
  # 18. A group commit's hold (--group-commit-hold-us-max) has no time limit: when the
  #     publishers a commit answered do not all come back, the others wait forever.
  mutant hold-without-limit gateway/src/streams/pace.rs \
    's/        if s.publishes - h.from < h.need \&\& now < h.until {/        if s.publishes - h.from < h.need {/'
fi

exit $failed
