//! The stream table and stream removal. Ids are dense in creation order and never reused: the
//! table keeps one 4-byte slot per id ever created — the live stream's position in a dense
//! `Vec<StreamState>`, or a tombstone once the stream is removed — plus the name → id map of
//! live streams. `Log::remove_stream` and the queries the gateway needs for expiry and
//! `--streams-max` live here too. No I/O of its own: records go through `Log::write_record`.
#![forbid(unsafe_code)]

use std::collections::{HashMap, VecDeque};
use std::ops::{Index, IndexMut};

use super::{AppendError, Bounds, Loc, Log};
use crate::event_id::{Epoch, Seq, StreamId};
use crate::format::{Kind, STREAM_REMOVED_SINCE_VERSION};
use crate::frame;
use crate::mmap;
use crate::options::FsyncPolicy;

/// Slot of a removed stream whose removal record is durable (covered by a completed sync, or
/// written under `fsync=never`, or known from recovery).
const REMOVED: u32 = u32::MAX;
/// Slot of a removed stream whose removal record is not durable yet.
const REMOVED_UNSYNCED: u32 = u32::MAX - 1;

/// In-memory state of one live stream.
#[derive(Debug)]
pub(super) struct StreamState {
    pub(super) id: StreamId,
    /// `id: {epoch}-{stream}-`, the constant start of this stream's framed events.
    pub(super) id_prefix: Box<[u8]>,
    pub(super) name: Box<str>,
    pub(super) floor: Seq,
    pub(super) tail: Seq,
    pub(super) visible: Seq,
    /// Locations of `floor..=tail`.
    pub(super) index: VecDeque<Loc>,
    /// Number of the last segment this stream's `SegMeta::streams` lists it in.
    pub(super) last_seg: Option<u64>,
    pub(super) dirty: bool,
}

impl StreamState {
    pub(super) fn new(
        epoch: Epoch,
        id: StreamId,
        name: Box<str>,
        floor: Seq,
        tail: Seq,
    ) -> StreamState {
        StreamState {
            id,
            id_prefix: frame::id_prefix(epoch, id),
            name,
            floor,
            tail,
            visible: tail,
            index: VecDeque::new(),
            last_seg: None,
            dirty: false,
        }
    }

    pub(super) fn bounds(&self) -> Bounds {
        Bounds {
            floor: self.floor,
            tail: self.tail,
            visible_tail: self.visible,
        }
    }
}

/// What an id names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Lookup {
    /// Never created (at or beyond the next id).
    Unknown,
    /// Created, then removed; `durable` once its removal record is.
    Removed { durable: bool },
    /// Live, at this position of the dense table.
    Live(usize),
}

/// Every stream id ever created: live ones with their state, removed ones as tombstones.
#[derive(Debug, Default)]
pub(super) struct Streams {
    /// Per id: position in `live`, or `REMOVED` / `REMOVED_UNSYNCED`.
    slots: Vec<u32>,
    /// Live streams, in no particular order (a removal moves the last one into the hole).
    live: Vec<StreamState>,
    /// Names of live streams only: a removed stream's name is free for a new stream.
    by_name: HashMap<Box<str>, StreamId>,
}

impl Streams {
    /// Number of ids ever created, removed ones included: the next stream's id.
    pub(super) fn ids(&self) -> usize {
        self.slots.len()
    }

    pub(super) fn live_count(&self) -> usize {
        self.live.len()
    }

    pub(super) fn lookup(&self, id: StreamId) -> Lookup {
        match self.slots.get(id.0 as usize) {
            None => Lookup::Unknown,
            Some(&REMOVED) => Lookup::Removed { durable: true },
            Some(&REMOVED_UNSYNCED) => Lookup::Removed { durable: false },
            Some(&pos) => Lookup::Live(pos as usize),
        }
    }

    pub(super) fn get(&self, id: StreamId) -> Option<&StreamState> {
        match self.lookup(id) {
            Lookup::Live(pos) => Some(&self.live[pos]),
            _ => None,
        }
    }

    pub(super) fn get_mut(&mut self, id: StreamId) -> Option<&mut StreamState> {
        match self.lookup(id) {
            Lookup::Live(pos) => Some(&mut self.live[pos]),
            _ => None,
        }
    }

    /// The live stream named `name`.
    pub(super) fn id_of(&self, name: &str) -> Option<StreamId> {
        self.by_name.get(name).copied()
    }

    /// Live streams in id order (skips tombstones: O(ids)).
    pub(super) fn iter(&self) -> impl Iterator<Item = &StreamState> + '_ {
        self.slots
            .iter()
            .filter(|&&pos| pos < REMOVED_UNSYNCED)
            .map(|&pos| &self.live[pos as usize])
    }

    /// Live streams in no particular order.
    pub(super) fn iter_live_mut(&mut self) -> impl Iterator<Item = &mut StreamState> + '_ {
        self.live.iter_mut()
    }

    /// Every id in order: `Some` for a live stream, `None` for a removed one.
    pub(super) fn iter_ids(&self) -> impl Iterator<Item = Option<&StreamState>> + '_ {
        self.slots
            .iter()
            .map(|&pos| (pos < REMOVED_UNSYNCED).then(|| &self.live[pos as usize]))
    }

    /// Adds the next id as a live stream. Its name must not name a live stream (callers check:
    /// `create_stream` is idempotent, recovery calls a duplicate corruption).
    pub(super) fn push_live(&mut self, st: StreamState) {
        assert_eq!(st.id.0 as usize, self.slots.len(), "stream ids are dense");
        assert!(self.live.len() < REMOVED_UNSYNCED as usize);
        let previous = self.by_name.insert(st.name.clone(), st.id);
        assert!(previous.is_none(), "two live streams named {:?}", st.name);
        self.slots.push(self.live.len() as u32);
        self.live.push(st);
    }

    /// Adds the next id as a stream removed durably (recovery: a checkpoint's tombstone).
    pub(super) fn push_removed(&mut self) {
        self.slots.push(REMOVED);
    }

    /// Removes live stream `id`: frees its state and its name. `durable`: whether its removal
    /// record is durable already.
    pub(super) fn remove(&mut self, id: StreamId, durable: bool) -> StreamState {
        let Lookup::Live(pos) = self.lookup(id) else {
            panic!("removing stream {id}, which is not live");
        };
        let st = self.live.swap_remove(pos);
        if let Some(moved) = self.live.get(pos) {
            self.slots[moved.id.0 as usize] = pos as u32;
        }
        self.slots[id.0 as usize] = if durable { REMOVED } else { REMOVED_UNSYNCED };
        let named = self.by_name.remove(&st.name);
        assert_eq!(named, Some(id), "the name map names the live stream");
        // Give memory back after a wave of removals (amortised: only below a quarter full).
        if self.live.capacity() > 64 && self.live.len() < self.live.capacity() / 4 {
            self.live.shrink_to(self.live.capacity() / 2);
        }
        if self.by_name.capacity() > 64 && self.by_name.len() < self.by_name.capacity() / 4 {
            self.by_name.shrink_to(self.by_name.capacity() / 2);
        }
        st
    }

    /// Drops the growth slack of the slots (after recovery built them).
    pub(super) fn shrink_slots(&mut self) {
        self.slots.shrink_to_fit();
    }

    /// The removal of `id` became durable.
    pub(super) fn mark_removal_durable(&mut self, id: StreamId) {
        let slot = &mut self.slots[id.0 as usize];
        assert!(*slot >= REMOVED_UNSYNCED, "stream {id} was removed");
        *slot = REMOVED;
    }

    /// Heap bytes held by the table (capacities, names, id prefixes and indexes): what a test
    /// measures the cost of a tombstone with.
    #[cfg(test)]
    fn heap_bytes(&self) -> usize {
        let per_name = size_of::<(Box<str>, StreamId)>() + 1; // + hashbrown's control byte
        self.slots.capacity() * size_of::<u32>()
            + self.live.capacity() * size_of::<StreamState>()
            + self.by_name.capacity() * per_name
            + self
                .live
                .iter()
                .map(|s| {
                    2 * s.name.len() + s.id_prefix.len() + s.index.capacity() * size_of::<Loc>()
                })
                .sum::<usize>()
    }
}

impl Index<StreamId> for Streams {
    type Output = StreamState;

    /// The live stream `id`; panics when it is not (callers hold a live id by invariant).
    fn index(&self, id: StreamId) -> &StreamState {
        self.get(id).expect("a live stream")
    }
}

impl IndexMut<StreamId> for Streams {
    fn index_mut(&mut self, id: StreamId) -> &mut StreamState {
        self.get_mut(id).expect("a live stream")
    }
}

/// A successful [`Log::remove_stream`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Removed {
    /// The removal is already durable: always true under `fsync=never` (as for appends), false
    /// otherwise — it becomes durable at the sync that reports it in `SyncReport::removed`
    /// (then [`Log::removal_is_durable`] is true).
    pub durable: bool,
}

/// Why `remove_stream` failed. The stream is unchanged when it fails (a failed roll may have
/// sealed the active segment, as for a failed append).
#[derive(Debug)]
pub enum RemoveError {
    /// No stream was ever created with this id.
    UnknownStream(StreamId),
    /// The stream was removed already (ids are never reused).
    AlreadyRemoved(StreamId),
    /// No space for a new segment. Retry after retention.
    DiskFull,
    /// An fsync failed earlier; the log refuses writes (reopen to recover from disk).
    Poisoned,
    /// The active segment is numbered `u64::MAX`: no segment can follow it.
    SegmentNumbersExhausted,
    Io(std::io::Error),
}

impl std::error::Error for RemoveError {}

impl std::fmt::Display for RemoveError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RemoveError::UnknownStream(s) => write!(f, "unknown stream {s}"),
            RemoveError::AlreadyRemoved(s) => write!(f, "stream {s} was removed already"),
            RemoveError::DiskFull => write!(f, "disk full: cannot allocate a new segment"),
            RemoveError::Poisoned => write!(f, "log is poisoned by an earlier fsync failure"),
            RemoveError::SegmentNumbersExhausted => write!(f, "no segment number left"),
            RemoveError::Io(e) => write!(f, "log write failed: {e}"),
        }
    }
}

impl From<AppendError> for RemoveError {
    /// The errors making room for a record can raise.
    fn from(e: AppendError) -> RemoveError {
        match e {
            AppendError::DiskFull => RemoveError::DiskFull,
            AppendError::Poisoned => RemoveError::Poisoned,
            AppendError::SegmentNumbersExhausted => RemoveError::SegmentNumbersExhausted,
            AppendError::Io(e) => RemoveError::Io(e),
            other => RemoveError::Io(std::io::Error::other(other.to_string())),
        }
    }
}

impl Log {
    /// Removes stream `id`: appends a *stream removed* record, then forgets the stream — its
    /// name maps to nothing (a later `create_stream` of the name gets a new id, so event IDs
    /// of this incarnation resume as another stream), its index is freed, and `bounds`,
    /// `stream_name` and `streams()` no longer show it; `append` answers
    /// `AppendError::StreamRemoved`, `read`/`record` `ReadError::StreamRemoved`.
    ///
    /// **Durability.** The record takes the appends' group-commit path. Under every policy but
    /// `never` the removal is durable only once a sync that began after it completes:
    /// [`Removed::durable`] is false, and the sync reports the id in `SyncReport::removed`
    /// (poll [`Log::removal_is_durable`] alternatively). Acknowledge a removal (e.g. answer
    /// `DELETE`) only then: a crash before it may bring the stream back, with every event it
    /// had (and nothing else is lost).
    /// The stream's own earlier appends precede the record in the log, so they are durable
    /// once the removal is. Under `never` the removal is visible and "durable" at once, like
    /// appends (it survives a process crash, not a power loss).
    ///
    /// Readers holding slices of the stream keep them (they pin their segments); the caller
    /// ends the stream's subscribers first — after this, `bounds(id)` is `None`.
    pub fn remove_stream(&mut self, id: StreamId) -> Result<Removed, RemoveError> {
        if self.poisoned {
            return Err(RemoveError::Poisoned);
        }
        let name_len = match self.streams.lookup(id) {
            Lookup::Unknown => return Err(RemoveError::UnknownStream(id)),
            Lookup::Removed { .. } => return Err(RemoveError::AlreadyRemoved(id)),
            Lookup::Live(pos) => self.streams.live[pos].name.len(),
        };
        // A segment written before the kind existed (an upgraded log's active segment) must
        // not hold it: an older reader would cut it and every later record as a torn tail.
        // Start a current-version segment instead (once per upgraded log).
        if self.active.version < STREAM_REMOVED_SINCE_VERSION {
            self.roll()?;
        }
        self.ensure_room(name_len)?;
        // Nothing fails from here on.
        let durable = self.opts.fsync == FsyncPolicy::Never;
        let st = self.streams.remove(id, durable);
        let ts = mmap::coarse_unix_ms();
        self.write_record(Kind::StreamRemoved, id, 0, ts, name_len, |buf| {
            buf.copy_from_slice(st.name.as_bytes())
        });
        if !durable {
            self.unsynced_removals.push(id);
        }
        Ok(Removed { durable })
    }

    /// Whether `id` names a stream that was created and then removed.
    pub fn is_removed(&self, id: StreamId) -> bool {
        matches!(self.streams.lookup(id), Lookup::Removed { .. })
    }

    /// Whether `id` was removed and its removal record is durable (see
    /// [`Log::remove_stream`]): the moment to acknowledge the removal. Then the removed
    /// stream's earlier appends are durable too, so a publish waiting for one can be answered.
    pub fn removal_is_durable(&self, id: StreamId) -> bool {
        self.streams.lookup(id) == Lookup::Removed { durable: true }
    }

    /// Whether live stream `id` retains no event: it never had one, or retention deleted all
    /// (`floor > tail`). An event appended but not yet durable counts as retained. False for
    /// an unknown or removed id. With no subscriber for long enough, the gateway expires it.
    pub fn stream_is_empty(&self, id: StreamId) -> bool {
        self.streams.get(id).is_some_and(|s| s.floor > s.tail)
    }

    /// Number of live (not removed) streams. O(1).
    pub fn live_stream_count(&self) -> usize {
        self.streams.live_count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LogOptions;

    fn st(id: u32, name: &str) -> StreamState {
        StreamState::new(Epoch(1), StreamId(id), name.into(), 1, 0)
    }

    #[test]
    fn removal_moves_the_last_live_stream_into_the_hole() {
        let mut t = Streams::default();
        for (i, n) in ["a", "b", "c"].iter().enumerate() {
            t.push_live(st(i as u32, n));
        }
        let gone = t.remove(StreamId(0), false);
        assert_eq!(&*gone.name, "a");
        assert_eq!(t.lookup(StreamId(0)), Lookup::Removed { durable: false });
        assert_eq!(t[StreamId(2)].id, StreamId(2));
        assert_eq!(t[StreamId(1)].id, StreamId(1));
        assert_eq!(t.id_of("a"), None);
        assert_eq!(t.id_of("c"), Some(StreamId(2)));
        t.push_live(st(3, "a"));
        assert_eq!(t.id_of("a"), Some(StreamId(3)));
        t.mark_removal_durable(StreamId(0));
        assert_eq!(t.lookup(StreamId(0)), Lookup::Removed { durable: true });
        assert_eq!(t.lookup(StreamId(4)), Lookup::Unknown);
        let names: Vec<&str> = t.iter().map(|s| &*s.name).collect();
        assert_eq!(names, ["b", "c", "a"], "id order");
        assert_eq!((t.ids(), t.live_count()), (4, 3));
    }

    /// What 100,000 created-and-removed streams leave behind, measured as the heap bytes of
    /// the stream table: after the removals, after a reopen that rebuilds them from the name
    /// and removal records, and after retention moved them into the checkpoint.
    #[test]
    fn a_removed_stream_costs_four_bytes() {
        const STREAMS: u32 = 100_000;
        let dir = tempfile::tempdir().unwrap();
        let opts = || LogOptions {
            segment_bytes: 1 << 20,
            record_bytes_max: 16 * 1024,
            retain_bytes: Some(2 << 20),
            ..LogOptions::default()
        };
        let mut log = Log::open(dir.path(), opts()).unwrap();
        let keep = log.create_stream("kept").unwrap();
        let base = log.streams.heap_bytes();
        for i in 1..=STREAMS {
            let s = log.create_stream(&format!("tenant-{i}/events")).unwrap();
            assert_eq!(s, StreamId(i));
            log.append(s, None, b"x").unwrap();
            assert!(log.remove_stream(s).unwrap().durable);
        }
        let per_removed = |log: &Log| {
            (log.streams.heap_bytes() - base.min(log.streams.heap_bytes())) as f64
                / f64::from(STREAMS)
        };
        // 4 bytes of slot, plus the slot vector's growth slack (it doubles: up to 4 more).
        let after_removals = per_removed(&log);
        eprintln!("tombstone: {after_removals:.2} B per removed stream (table heap)");
        assert!(after_removals <= 8.5, "{after_removals}");
        assert_eq!((log.stream_count(), log.live_stream_count()), (100_001, 1));
        drop(log);

        let mut log = Log::open(dir.path(), opts()).unwrap();
        let after_reopen = per_removed(&log);
        eprintln!("after reopen (rebuilt from records): {after_reopen:.2} B per removed stream");
        assert!(after_reopen <= 4.5, "{after_reopen}");
        // Retire every segment holding those records: the tombstones go to the checkpoint.
        let payload = "k".repeat(4000);
        while log.active_segment() < 8 {
            log.append(keep, None, payload.as_bytes()).unwrap();
        }
        let report = log.enforce_retention(std::time::SystemTime::now()).unwrap();
        assert!(report.segments_deleted >= 4);
        drop(log);
        let ckpt = std::fs::metadata(dir.path().join("checkpoint"))
            .unwrap()
            .len();
        eprintln!("checkpoint: {ckpt} bytes for {STREAMS} removed + 1 live stream");
        assert!(ckpt < u64::from(STREAMS) + 100);
        let mut log = Log::open(dir.path(), opts()).unwrap();
        let after_ckpt = per_removed(&log);
        eprintln!("after reopen from the checkpoint: {after_ckpt:.2} B per removed stream");
        assert!(after_ckpt <= 4.5, "{after_ckpt}");
        assert!(log.is_removed(StreamId(STREAMS)));
        assert_eq!(
            log.create_stream("tenant-1/events").unwrap(),
            StreamId(STREAMS + 1)
        );
    }
}
