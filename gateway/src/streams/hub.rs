//! The streams a core owns: its shards' logs, the subscriber registry (which connections
//! follow which stream), the streams touched this turn, and the group commit that makes
//! appends visible — after which the answers waiting for them leave and the subscribers of
//! every stream whose visible tail moved are woken. Group commits are asynchronous: the hub
//! says which files to `fdatasync` ([`Hub::start_syncs`]) — or, with a sync directory
//! (`--fsync-scope filesystem`), one `syncfs` for every shard whose commit starts in the same
//! round —, the core runs them through its ring, and each completion comes back here
//! ([`Hub::on_fsync`], [`Hub::on_syncfs`]). Retention and the `/metrics` stream lines. No I/O
//! of its own beyond the log's.
#![forbid(unsafe_code)]

use std::collections::HashMap;

use rustc_hash::FxHashMap;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant, SystemTime};

use log_store::{
    AppendError, EventId, KeyRecord, Log, RemoveError, Removed, StreamId, SyncJob, SyncReport,
};

use super::StreamKey;
use super::catalog::{StreamKind, StreamQuota};
use super::pace::Pace;
use super::publish;
use super::sub::PENDING_STREAM;
use super::subjects::{self, Subject, SubjectQuota};
use super::unborn::Unborn;
use crate::proto::conn::Wait;
use crate::{metrics, shards};

pub use super::SubRef;

/// The streams of one core.
#[derive(Debug)]
pub struct Hub {
    /// Keyed by server-assigned integers (shard numbers, stream ids), looked up per delivery:
    /// a fast hash, not SipHash.
    logs: FxHashMap<u32, Log>,
    subs: FxHashMap<StreamKey, Vec<SubRef>>,
    /// Streams appended to or made visible this turn (sorted and deduplicated at its end).
    touched: Vec<StreamKey>,
    shards: u32,
    /// Group commits in flight, by shard.
    syncs: FxHashMap<u32, Pending>,
    /// Shards whose group commit failed since the last `take_failed` (their logs are poisoned).
    failed: Vec<u32>,
    /// `--fsync-scope filesystem`: where and when a round is one `syncfs`. `None`: one
    /// `fdatasync` per file.
    sync_dir: Option<SyncDir>,
    /// The `syncfs` round in flight (one at a time): its number and the shards it covers.
    round: Option<(u32, Vec<u32>)>,
    next_round: u32,
    /// Since when each API stream has had no retained event and no subscriber (idle expiry).
    idle_since: HashMap<StreamKey, Instant>,
    /// Subscribers of streams not created yet (registered under `PENDING_STREAM` keys).
    unborn: Unborn,
    /// When each shard's next group commit may start (`--group-commit-hold-us-max`).
    pace: Pace,
}

/// Round numbers wrap within the 24 bits an operation's `user_data` carries.
const ROUND_MASK: u32 = (1 << 24) - 1;

/// Where a round of group commits is one `syncfs` (`--fsync-scope filesystem`).
#[derive(Debug)]
pub struct SyncDir {
    /// A descriptor of the data directory, opened for this core alone (`syncfs` reports each
    /// writeback error once per open file description), on the filesystem holding every log
    /// of the core.
    pub fd: OwnedFd,
    /// The fewest files a round names to be one `syncfs` (the gateway: 2; a round of one file
    /// is its `fdatasync`).
    pub files_min: usize,
}

/// One sync operation of a group-commit round ([`Hub::start_syncs`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncOp {
    /// `fdatasync` of one of `shard`'s files.
    File { shard: u32, fd: RawFd },
    /// `syncfs` of the filesystem holding `fd` (the sync directory), covering round `round`.
    Filesystem { round: u32, fd: RawFd },
}

/// A group commit in flight: its job, the `fdatasync`s not completed yet, the first error.
#[derive(Debug)]
struct Pending {
    job: SyncJob,
    left: usize,
    error: Option<std::io::Error>,
    /// The turn its `fdatasync`s were started in.
    started: Instant,
}

impl Hub {
    pub fn new(logs: Vec<(u32, Log)>, shards: u32) -> Hub {
        Hub {
            logs: logs.into_iter().collect(),
            subs: FxHashMap::default(),
            touched: Vec::new(),
            shards,
            syncs: FxHashMap::default(),
            failed: Vec::new(),
            sync_dir: None,
            round: None,
            next_round: 0,
            idle_since: HashMap::new(),
            unborn: Unborn::default(),
            pace: Pace::new(Duration::ZERO),
        }
    }

    /// Group commits that start in the same round share one `syncfs` of the filesystem of
    /// `dir` (which must hold every log of this hub) when they name `dir.files_min` files or
    /// more.
    pub fn with_sync_dir(mut self, dir: Option<SyncDir>) -> Hub {
        self.sync_dir = dir;
        self
    }

    /// `--group-commit-hold-us-max`: how long a shard's next group commit may wait for the
    /// publishers its last one answered ([`Pace`]); zero never holds.
    pub fn with_commit_hold(mut self, hold_max: Duration) -> Hub {
        self.pace = Pace::new(hold_max);
        self
    }

    /// The cluster's (or the data directory's) shard count.
    pub fn shards(&self) -> u32 {
        self.shards
    }

    /// The shard owning `stream`.
    pub fn shard_of(&self, stream: &str) -> u32 {
        shards::shard_of(stream, self.shards)
    }

    /// A shard's log (this core owns it).
    pub fn log(&self, shard: u32) -> &Log {
        self.logs.get(&shard).expect("owner core holds the shard")
    }

    pub fn log_mut(&mut self, shard: u32) -> &mut Log {
        self.logs
            .get_mut(&shard)
            .expect("owner core holds the shard")
    }

    /// Every log of this core, by shard.
    pub fn logs_mut(&mut self) -> impl Iterator<Item = (u32, &mut Log)> {
        self.logs.iter_mut().map(|(s, l)| (*s, l))
    }

    /// The logs, the hub gone (the simulator's crash).
    pub fn into_logs(self) -> Vec<(u32, Log)> {
        self.logs.into_iter().collect()
    }

    /// Whether `shard`'s log is poisoned (a group commit failed): nothing more of it becomes
    /// visible, so no answer may wait for it.
    pub fn poisoned(&self, shard: u32) -> bool {
        self.logs.get(&shard).is_some_and(Log::is_poisoned)
    }

    pub fn has_shard(&self, shard: u32) -> bool {
        self.logs.contains_key(&shard)
    }

    /// The stream named `stream`, if it exists.
    pub fn stream_key(&self, stream: &str) -> Option<StreamKey> {
        let shard = self.shard_of(stream);
        Some((shard, self.log(shard).stream_id(stream)?))
    }

    /// The stream named `stream`, created if new (its unborn subscribers move to it with
    /// [`Hub::adopt_unborn`]).
    pub fn open_stream(&mut self, stream: &str) -> Result<StreamKey, AppendError> {
        let shard = self.shard_of(stream);
        let sid = self.log_mut(shard).create_stream(stream)?;
        Ok((shard, sid))
    }

    /// Creates the API stream `stream` under `--streams-max` and `who`'s
    /// `--streams-per-subject-max` (a refusal is counted in its metric and creates nothing;
    /// its unborn subscribers are the caller's to move, [`Hub::adopt_unborn`]). The error is
    /// the answer: status, code, message.
    pub fn create_api_stream(
        &mut self,
        (quota, subjects): (&StreamQuota, &SubjectQuota),
        who: &Subject,
        stream: &str,
        m: &metrics::CoreMetrics,
    ) -> Result<StreamKey, (u16, &'static str, String)> {
        if let Err(e) = subjects::reserve(quota, subjects, who, stream) {
            e.counter(m)
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return Err((e.status().0, e.status().1, e.to_string()));
        }
        self.open_stream(stream).map_err(|e| {
            subjects::release(quota, subjects, stream);
            let (status, code) = publish::append_status(&e);
            (status, code, e.to_string())
        })
    }

    /// Appends a publish's `events` to `key` (`publish::append`: all or, on a refusal, none),
    /// noted for this turn's wake-ups and counted; the answer and its wait.
    pub fn append_events(
        &mut self,
        key: StreamKey,
        events: &[publish::Event],
        (batch, close): (bool, bool),
        m: &metrics::CoreMetrics,
    ) -> publish::Published {
        let p = publish::append(self.log_mut(key.0), key.0, key.1, events, batch, close);
        if p.appended > 0 {
            self.pace.published(key.0);
        }
        self.record_appends(key, p.appended);
        m.events_appended_total
            .fetch_add(p.appended as u64, std::sync::atomic::Ordering::Relaxed);
        p
    }

    /// Writes a stored keyed publish's key record after its events (in the turn that appended
    /// them, so the same group commit makes it durable with them).
    pub fn append_key(
        &mut self,
        shard: u32,
        (first, count): (EventId, u32),
        key: &[u8],
    ) -> Result<(), AppendError> {
        self.log_mut(shard)
            .append_key(first.stream, first.seq, count, key)
    }

    /// The key records every shard's log recovered, with their stream's name and first ID
    /// (once, at start).
    pub fn take_recovered_keys(&mut self) -> Vec<(String, EventId, KeyRecord)> {
        let mut out = Vec::new();
        for log in self.logs.values_mut() {
            let epoch = log.epoch();
            for k in log.take_recovered_keys() {
                let Some(name) = log.stream_name(k.stream) else {
                    continue;
                };
                let first = EventId {
                    epoch,
                    stream: k.stream,
                    seq: k.first,
                };
                out.push((name.to_owned(), first, k));
            }
        }
        out
    }

    /// Notes `n` appends to `key` for this turn's wake-ups.
    pub fn record_appends(&mut self, key: StreamKey, n: usize) {
        if n == 0 {
            return;
        }
        self.touched.push(key);
    }

    /// Whether `w`'s event is visible (durable under `--fsync`). A removed stream's waits end
    /// once its removal is durable: every append before it is durable then (and a `DELETE`
    /// waits with `seq` = `u64::MAX` for exactly that).
    pub fn visible(&self, w: Wait) -> bool {
        // A cluster publish's placeholder is replaced by the core once applied, never released.
        let Wait::Durable { shard, stream, seq } = w else {
            return false;
        };
        let Some(log) = self.logs.get(&shard) else {
            return false;
        };
        let id = StreamId(stream);
        match log.bounds(id) {
            Some(b) => b.visible_tail >= seq,
            None => log.removal_is_durable(id),
        }
    }

    /// Removes the stream (its subscribers must be gone): a durable *stream removed* record;
    /// the name is free again. [`Removed::durable`] false: answer only once
    /// [`Hub::visible`] says so for a wait on `(key, u64::MAX)`.
    pub fn remove_stream(&mut self, key: StreamKey) -> Result<Removed, RemoveError> {
        assert!(
            self.subscribers(key).is_empty(),
            "a stream is removed only once its subscribers are gone"
        );
        self.subs.remove(&key);
        self.idle_since.remove(&key);
        self.log_mut(key.0).remove_stream(key.1)
    }

    /// The API streams with no retained event and no subscriber for `after` (checked at each
    /// call; MCP streams are the MCP front's).
    pub fn idle_streams(&mut self, now: Instant, after: Duration) -> Vec<StreamKey> {
        let mut due = Vec::new();
        let mut idle = std::mem::take(&mut self.idle_since);
        let mut still = HashMap::with_capacity(idle.len());
        for (&s, log) in &self.logs {
            for (id, name, _) in log.streams() {
                let key = (s, id);
                if StreamKind::of(name) != StreamKind::Api
                    || !log.stream_is_empty(id)
                    || self.subs.contains_key(&key)
                {
                    continue;
                }
                let since = idle.remove(&key).unwrap_or(now);
                if now.duration_since(since) >= after {
                    due.push(key);
                } else {
                    still.insert(key, since);
                }
            }
        }
        idle.clear();
        self.idle_since = still;
        due
    }

    /// The streams touched this turn — appended to (visible at once under `--fsync never`) or
    /// made visible by a completed group commit — sorted, deduplicated, emptied.
    pub fn end_turn(&mut self) -> Vec<StreamKey> {
        self.take_touched()
    }

    /// Starts the group commits due now (one in flight per shard at most): the files to
    /// `fdatasync` ([`SyncOp::File`], each completion to [`Hub::on_fsync`]), or with a sync
    /// directory and its `files_min` files or more, one `syncfs` for all of them ([`SyncOp::Filesystem`],
    /// its completion to [`Hub::on_syncfs`]). The `syncfs` starts after every job of its round
    /// began (they are taken here, before the core submits it), so it covers their records.
    /// With a sync directory, nothing starts while a `syncfs` round is in flight.
    pub fn start_syncs(&mut self, now: Instant) -> Vec<SyncOp> {
        if self.round.is_some() {
            // One syncfs round in flight at a time: what is dirty meanwhile waits to go
            // together in the next (a second round would queue behind the first anyway).
            return Vec::new();
        }
        let files = self.begin_jobs(now);
        let Some(dir) = &self.sync_dir else {
            return files;
        };
        if files.is_empty() || files.len() < dir.files_min {
            return files;
        }
        let round = self.next_round;
        self.next_round = (self.next_round + 1) & ROUND_MASK;
        let mut shards: Vec<u32> = (files.iter())
            .filter_map(|op| match *op {
                SyncOp::File { shard, .. } => Some(shard),
                SyncOp::Filesystem { .. } => None,
            })
            .collect();
        shards.dedup();
        for s in &shards {
            self.syncs.get_mut(s).expect("begun above").left = 1;
        }
        self.round = Some((round, shards));
        vec![SyncOp::Filesystem {
            round,
            fd: dir.fd.as_raw_fd(),
        }]
    }

    /// Takes a job from every log whose group commit is due: its files' `fdatasync`s, each
    /// shard's together.
    fn begin_jobs(&mut self, now: Instant) -> Vec<SyncOp> {
        let mut out = Vec::new();
        for (&s, log) in self.logs.iter_mut() {
            if !log.sync_due(now) || (holds(&self.sync_dir, log) && self.pace.held(s, now)) {
                continue;
            }
            let Some(job) = log.begin_sync() else {
                continue;
            };
            self.pace.began(s);
            let before = out.len();
            out.extend(job.fds().map(|fd| SyncOp::File {
                shard: s,
                fd: fd.as_raw_fd(),
            }));
            let left = out.len() - before;
            self.syncs.insert(
                s,
                Pending {
                    job,
                    left,
                    error: None,
                    started: now,
                },
            );
        }
        out
    }

    /// One `fdatasync` of `shard`'s group commit completed (`res` 0 or -errno). When it was
    /// the last, the commit ends: its streams become visible, or — any error — the log is
    /// poisoned and the shard is reported by [`Hub::take_failed`]. Returns how long this
    /// `fdatasync` took, from the turn it was started in to `now`.
    pub fn on_fsync(&mut self, shard: u32, res: i32, core: usize, now: Instant) -> Duration {
        let p = self
            .syncs
            .get_mut(&shard)
            .expect("an fsync completion names a group commit in flight");
        let took = now.saturating_duration_since(p.started);
        if res < 0 && p.error.is_none() {
            p.error = Some(std::io::Error::from_raw_os_error(-res));
        }
        p.left -= 1;
        if p.left > 0 {
            return took;
        }
        let p = self.syncs.remove(&shard).expect("present");
        self.pace.ended(shard, now, took);
        let outcome = p.error.map_or(Ok(()), Err);
        match self.log_mut(shard).finish_sync(p.job, outcome) {
            Ok(r) => self.note_synced(shard, &r),
            Err(e) => {
                tracing::error!(core, shard, "group commit failed, log poisoned: {e}");
                self.failed.push(shard);
            }
        }
        took
    }

    /// Round `round`'s `syncfs` completed (`res` 0 or -errno): every group commit it covers
    /// ends as [`Hub::on_fsync`] ends one (an error poisons each of their logs). Returns how
    /// long it took; `None` for a round not in flight (nothing is done).
    pub fn on_syncfs(
        &mut self,
        round: u32,
        res: i32,
        core: usize,
        now: Instant,
    ) -> Option<Duration> {
        let (_, shards) = self.round.take_if(|(r, _)| *r == round)?;
        let mut took = None;
        for s in shards {
            took = Some(self.on_fsync(s, res, core, now));
        }
        took
    }

    /// Shards whose group commit failed since the last call.
    pub fn take_failed(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.failed)
    }

    /// Makes every log durable now (shutdown); returns the streams this made visible.
    pub fn sync_all(&mut self, core: usize) -> Vec<StreamKey> {
        let shards: Vec<u32> = self.logs.keys().copied().collect();
        for s in shards {
            match self.log_mut(s).sync_now() {
                Ok(r) => self.note_synced(s, &r),
                Err(e) => tracing::error!(core, shard = s, "sync failed: {e:?}"),
            }
        }
        self.take_touched()
    }

    fn note_synced(&mut self, shard: u32, r: &SyncReport) {
        self.touched
            .extend(r.advanced.iter().map(|(sid, _)| (shard, *sid)));
        self.touched
            .extend(r.removed.iter().map(|sid| (shard, *sid)));
    }

    fn take_touched(&mut self) -> Vec<StreamKey> {
        let mut t = std::mem::take(&mut self.touched);
        t.sort_unstable_by_key(|(s, id)| (*s, id.0));
        t.dedup();
        t
    }

    /// The earliest sync deadline of the core's logs with no group commit in flight.
    /// While a `syncfs` round is in flight nothing starts (its completion is the next event).
    pub fn next_sync_deadline(&self) -> Option<Instant> {
        if self.round.is_some() {
            return None;
        }
        (self.logs.iter())
            .filter_map(|(s, l)| {
                let due = l.next_sync_deadline()?;
                let held = holds(&self.sync_dir, l)
                    .then(|| self.pace.until(*s))
                    .flatten();
                Some(held.map_or(due, |held| held.max(due)))
            })
            .min()
    }

    // ---- subscribers ----

    pub fn subscribe(&mut self, key: StreamKey, sub: SubRef) {
        self.subs.entry(key).or_default().push(sub);
    }

    pub fn unsubscribe(&mut self, key: StreamKey, slot: u32) {
        if let Some(list) = self.subs.get_mut(&key) {
            list.retain(|(s, _)| *s != slot);
            if list.is_empty() {
                self.subs.remove(&key);
            }
        }
    }

    /// The subscribers of streams not created yet.
    pub fn unborn(&self) -> &Unborn {
        &self.unborn
    }

    pub fn unborn_mut(&mut self) -> &mut Unborn {
        &mut self.unborn
    }

    /// `name` was just created as `key`: its unborn subscribers are registered under it, and
    /// returned (each connection's subscriber still names the pending key).
    pub fn adopt_unborn(&mut self, name: &str, key: StreamKey) -> Vec<SubRef> {
        let subs = self.unborn.take(name);
        for &r in &subs {
            self.unsubscribe((key.0, PENDING_STREAM), r.0);
            self.subscribe(key, r);
        }
        subs
    }

    /// The subscribers of `key`.
    pub fn subscribers(&self, key: StreamKey) -> &[SubRef] {
        self.subs.get(&key).map_or(&[], Vec::as_slice)
    }

    // ---- housekeeping ----

    /// Retention by bytes and age on every log.
    pub fn enforce_retention(&mut self, wall: SystemTime, core: usize) {
        for (s, log) in self.logs.iter_mut() {
            if let Err(e) = log.enforce_retention(wall) {
                tracing::error!(core, shard = s, "retention: {e:?}");
            }
        }
    }

    /// Live streams in the core's logs.
    pub fn stream_count(&self) -> usize {
        self.logs.values().map(Log::live_stream_count).sum()
    }

    /// The segment rolls of this core's logs, summed.
    pub fn roll_counts(&self) -> log_store::RollCounts {
        let mut all = log_store::RollCounts::default();
        for r in self.logs.values().map(Log::roll_counts) {
            all.prepared += r.prepared;
            all.inline += r.inline;
            all.flushed += r.flushed;
            all.prepare_failures += r.prepare_failures;
        }
        all
    }

    /// The per-stream lines of `/metrics`, for at most `max` streams. MCP streams are never
    /// listed: their names carry session IDs, a session's only credential.
    pub fn stream_lines(&self, max: usize) -> String {
        let mut out = String::new();
        let mut shards: Vec<_> = self.logs.keys().copied().collect();
        shards.sort_unstable();
        let listed = shards
            .iter()
            .flat_map(|&s| self.logs[&s].streams().map(move |st| (s, st)))
            .filter(|(_, (_, name, _))| StreamKind::of(name) == StreamKind::Api)
            .take(max);
        for (s, (_, name, b)) in listed {
            metrics::stream_lines(&mut out, s, name, b.floor, b.tail, b.visible_tail);
        }
        out
    }
}

/// Whether a log's commits are held by [`Pace`]: under `group` (and `always`, the same) and
/// one `fdatasync` per file. Not under `interval:<ms>` (its interval batches already), nor with
/// `syncfs` rounds (shards whose holds end apart would split a round into lone files).
fn holds(sync_dir: &Option<SyncDir>, log: &Log) -> bool {
    sync_dir.is_none()
        && matches!(
            log.options().fsync,
            log_store::FsyncPolicy::Group | log_store::FsyncPolicy::Always
        )
}

#[cfg(test)]
#[path = "hub_tests.rs"]
mod tests;
