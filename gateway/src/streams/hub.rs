//! The streams a core owns: its shards' logs, the subscriber registry (which connections
//! follow which stream), the streams touched this turn, and the group commit that makes
//! appends visible — after which the answers waiting for them leave and the subscribers of
//! every stream whose visible tail moved are woken. Retention and the `/metrics` stream lines.
//! No I/O of its own beyond the log's (the log is the storage engine).
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::time::{Instant, SystemTime};

use log_store::{AppendError, Log, SyncReport};

use super::StreamKey;
use crate::proto::conn::Wait;
use crate::{metrics, shards};

/// A subscriber connection: (slot, generation).
pub type SubRef = (u32, u32);

/// The streams of one core.
#[derive(Debug)]
pub struct Hub {
    logs: HashMap<u32, Log>,
    subs: HashMap<StreamKey, Vec<SubRef>>,
    /// Streams appended to or made visible this turn (sorted and deduplicated at its end).
    touched: Vec<StreamKey>,
    appended_shards: Vec<u32>,
    shards: u32,
}

impl Hub {
    pub fn new(logs: Vec<(u32, Log)>, shards: u32) -> Hub {
        Hub {
            logs: logs.into_iter().collect(),
            subs: HashMap::new(),
            touched: Vec::new(),
            appended_shards: Vec::new(),
            shards,
        }
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

    pub fn has_shard(&self, shard: u32) -> bool {
        self.logs.contains_key(&shard)
    }

    /// The stream named `stream`, created if new (subscribers commonly come before the
    /// first publish).
    pub fn open_stream(&mut self, stream: &str) -> Result<StreamKey, AppendError> {
        let shard = self.shard_of(stream);
        let sid = self.log_mut(shard).create_stream(stream)?;
        Ok((shard, sid))
    }

    /// Notes `n` appends to `key` for this turn's group commit and wake-ups.
    pub fn record_appends(&mut self, key: StreamKey, n: usize) {
        if n == 0 {
            return;
        }
        if !self.appended_shards.contains(&key.0) {
            self.appended_shards.push(key.0);
        }
        self.touched.push(key);
    }

    /// Whether `w`'s event is visible (durable under `--fsync`).
    pub fn visible(&self, w: Wait) -> bool {
        self.logs
            .get(&w.shard)
            .and_then(|l| l.bounds(log_store::StreamId(w.stream)))
            .is_some_and(|b| b.visible_tail >= w.seq)
    }

    /// Group commit for the shards appended to this turn and those whose sync deadline
    /// passed; returns the streams touched this turn (sorted, deduplicated), emptied.
    pub fn end_turn(&mut self, now: Instant, core: usize) -> Vec<StreamKey> {
        let mut shards = std::mem::take(&mut self.appended_shards);
        for (&s, log) in &self.logs {
            if !shards.contains(&s) && log.next_sync_deadline().is_some_and(|d| d <= now) {
                shards.push(s);
            }
        }
        for s in shards {
            match self.log_mut(s).poll_sync(now) {
                Ok(r) => self.note_synced(s, &r),
                Err(e) => eprintln!("core {core}: sync of shard {s} failed: {e:?}"),
            }
        }
        self.take_touched()
    }

    /// Makes every log durable now (shutdown); returns the streams this made visible.
    pub fn sync_all(&mut self, core: usize) -> Vec<StreamKey> {
        let shards: Vec<u32> = self.logs.keys().copied().collect();
        for s in shards {
            match self.log_mut(s).sync_now() {
                Ok(r) => self.note_synced(s, &r),
                Err(e) => eprintln!("core {core}: sync of shard {s} failed: {e:?}"),
            }
        }
        self.take_touched()
    }

    fn note_synced(&mut self, shard: u32, r: &SyncReport) {
        self.touched
            .extend(r.advanced.iter().map(|(sid, _)| (shard, *sid)));
    }

    fn take_touched(&mut self) -> Vec<StreamKey> {
        let mut t = std::mem::take(&mut self.touched);
        t.sort_unstable_by_key(|(s, id)| (*s, id.0));
        t.dedup();
        t
    }

    /// The earliest sync deadline of the core's logs.
    pub fn next_sync_deadline(&self) -> Option<Instant> {
        self.logs.values().filter_map(Log::next_sync_deadline).min()
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

    /// The subscribers of `key`.
    pub fn subscribers(&self, key: StreamKey) -> &[SubRef] {
        self.subs.get(&key).map_or(&[], Vec::as_slice)
    }

    // ---- housekeeping ----

    /// Retention by bytes and age on every log.
    pub fn enforce_retention(&mut self, wall: SystemTime, core: usize) {
        for (s, log) in self.logs.iter_mut() {
            if let Err(e) = log.enforce_retention(wall) {
                eprintln!("core {core}: retention on shard {s}: {e:?}");
            }
        }
    }

    /// The per-stream lines of `/metrics`.
    pub fn stream_lines(&self) -> String {
        let mut out = String::new();
        let mut shards: Vec<_> = self.logs.keys().copied().collect();
        shards.sort_unstable();
        for s in shards {
            for (_, name, b) in self.logs[&s].streams() {
                metrics::stream_lines(&mut out, s, name, b.floor, b.tail, b.visible_tail);
            }
        }
        out
    }
}
