//! The log: open (create or recover), append with SSE framing, group-commit sync, reads as
//! mapped slices, retention. One writer (`&mut self`); readers hold [`LogSlice`]s that pin their
//! segment. It does not frame anything but SSE events, knows nothing about sockets, and never
//! touches mapped memory except through `crate::mmap` (this module has no `unsafe`).
//!
//! Invariants (asserted where cheap):
//! - per stream, `1 <= floor <= visible_tail + 1 <= tail + 1`, and the index holds exactly the
//!   locations of `floor..=tail`, in order;
//! - segments are numbered contiguously; only the last one (the active one) is written;
//! - the bytes of every indexed record are frozen (immutable) in their segment's mapping.
#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::fmt;
use std::fs::{self, File};
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::event_id::{Epoch, EventId, Seq, StreamId};
use crate::format::{
    Checkpoint, CheckpointStream, ENTRY_BYTES, Entry, HEADER_BYTES, Header, Kind, SEGMENT_VERSION,
};
pub use crate::format::{CheckpointError, EntryError, HeaderError, STREAM_NAME_BYTES_MAX};
use crate::frame;
use crate::mmap::{self, SharedMap, WriteToken};
use crate::options::{FsyncPolicy, LogOptions, LogOptionsError};
pub use roll::RollCounts;
use segfile::{SegFile, Stamp};
use streams::{Lookup, StreamState, Streams};
pub use streams::{RemoveError, Removed};
use sync::{Held, Syncing};

const CHECKPOINT_FILE: &str = "checkpoint";
const CHECKPOINT_TMP_FILE: &str = "checkpoint.tmp";
const LOCK_FILE: &str = "LOCK";
/// A deleted segment's file kept for reuse by the next roll (its pages stay in the page cache,
/// so the new segment needs no fresh zeroed pages: see BENCHMARKS.md).
const SPARE_FILE: &str = "spare";
const SEGMENT_SUFFIX: &str = ".seg";

// ---------------------------------------------------------------------------------------------
// Public types
// ---------------------------------------------------------------------------------------------

/// A stream's retained range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// First retained sequence (1 when nothing was ever deleted); `tail + 1` when empty.
    pub floor: Seq,
    /// Last appended sequence (0 = none yet).
    pub tail: Seq,
    /// Last sequence readers may see: durable under the fsync policy (`== tail` for `Never`).
    pub visible_tail: Seq,
}

/// Result of a successful append.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    pub id: EventId,
    /// Already durable (and visible) under the policy: always true for `Never`, false otherwise
    /// (it becomes durable at the `poll_sync`/`sync_now` that reports its stream advanced).
    pub durable: bool,
}

/// What one sync made durable: streams whose visible tail advanced, and stream removals.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncReport {
    pub advanced: Vec<(StreamId, Seq)>,
    /// Streams whose removal ([`Log::remove_stream`]) became durable.
    pub removed: Vec<StreamId>,
}

/// A group commit for the caller to carry out: `fdatasync` each file of [`SyncJob::fds`]
/// (e.g. one io_uring `FSYNC` with `IORING_FSYNC_DATASYNC` each), then pass the outcome to
/// [`Log::finish_sync`]. It holds the segments it names, so their files stay open meanwhile.
#[derive(Debug)]
pub struct SyncJob {
    segs: Vec<Arc<Segment>>,
}

impl SyncJob {
    /// The files to `fdatasync`.
    pub fn fds(&self) -> impl Iterator<Item = BorrowedFd<'_>> + '_ {
        self.segs.iter().map(|s| s.file().as_fd())
    }
}

/// What one retention pass deleted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetentionReport {
    pub segments_deleted: usize,
    pub bytes_deleted: u64,
    /// Streams whose floor moved, with the new floor.
    pub floors_advanced: Vec<(StreamId, Seq)>,
}

/// What recovery found at open.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// True when the directory held no log and a new one (new epoch) was created.
    pub created: bool,
    pub segments_scanned: usize,
    pub records_recovered: u64,
    /// Bytes of record payload and entries verified.
    pub bytes_scanned: u64,
    /// Byte offset (of the first bad entry) where the active segment's torn tail was cut.
    pub torn_tail_offset: Option<u64>,
    /// Segment files below the checkpoint's first live segment, deleted at open.
    pub stale_segments_deleted: usize,
    /// Streams whose checkpointed tail was not found on disk (power loss under `Never`); their
    /// floor was moved past the checkpointed tail so the lost range reads as truncated.
    pub streams_behind_checkpoint: Vec<StreamId>,
}

/// Why a read was refused. `read(from = visible_tail + 1)` is not an error (empty batch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadError {
    UnknownStream,
    /// The stream was removed ([`Log::remove_stream`]); its events are never served.
    StreamRemoved,
    /// `requested` is below the retained floor: those events were deleted.
    Truncated {
        requested: Seq,
        floor: Seq,
        tail: Seq,
    },
    /// `requested` is beyond `visible_tail + 1` (`tail` here is the visible tail).
    BeyondTail {
        requested: Seq,
        tail: Seq,
    },
}

/// A run of framed SSE bytes inside a mapped segment; pins the segment (mapped, file present)
/// while it or a clone lives. `as_bytes()` is stable for the slice's lifetime.
#[derive(Clone)]
pub struct LogSlice {
    seg: Arc<Segment>,
    off: u32,
    len: u32,
    first_seq: Seq,
    last_seq: Seq,
}

/// Up to `bytes_max` bytes of one stream's records `first..=last` (empty when `last < first`).
#[derive(Debug, Clone, Default)]
pub struct ReadBatch {
    pub slices: Vec<LogSlice>,
    pub first: Seq,
    pub last: Seq,
    /// Framed length of each record `first..=last`.
    pub record_lens: Vec<u32>,
}

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------

/// Why `Log::open` failed. Nothing is deleted or rewritten when it fails, except what recovery
/// is documented to repair (a torn tail of the active segment, a blank last segment, stale
/// segments below the checkpoint).
#[derive(Debug)]
pub enum OpenError {
    Options(LogOptionsError),
    Io {
        path: PathBuf,
        source: io::Error,
    },
    /// Another `Log` holds the directory's lock.
    Locked {
        path: PathBuf,
    },
    Random(getrandom::Error),
    Checkpoint {
        path: PathBuf,
        reason: CheckpointError,
    },
    /// A segment file's size is not a valid segment size.
    BadSegmentSize {
        path: PathBuf,
        bytes: u64,
    },
    BadHeader {
        path: PathBuf,
        reason: HeaderError,
    },
    /// A header field disagrees with the file name, the file size or the log's epoch.
    HeaderMismatch {
        path: PathBuf,
        field: &'static str,
        expected: u64,
        found: u64,
    },
    /// Segment numbers are not contiguous from the first live one.
    MissingSegment {
        number: u64,
    },
    /// A bad record inside a sealed segment (or a semantically impossible one anywhere).
    Corrupt {
        path: PathBuf,
        offset: u64,
        reason: CorruptReason,
    },
}

/// What exactly is wrong at `OpenError::Corrupt`'s offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CorruptReason {
    Entry(EntryError),
    /// The entry's payload range does not fit between the data area and the entry.
    OutOfBounds {
        data_off: u32,
        len: u32,
    },
    /// The entry's payload does not start where the previous one ended.
    DataOffset {
        expected: u32,
        found: u32,
    },
    UnknownStream(StreamId),
    SequenceGap {
        stream: StreamId,
        expected: Seq,
        found: Seq,
    },
    StreamIdGap {
        expected: u32,
        found: u32,
    },
    StreamNameMismatch(StreamId),
    StreamNameInvalid,
    /// A record of a stream after its removal record (an event, its name, a second removal).
    StreamRemoved(StreamId),
    /// A stream name record names a live stream under another id.
    DuplicateStreamName(StreamId),
    BadSeal {
        expected: u64,
        found: u64,
    },
    /// A segment that is not the last one has no seal entry.
    NotSealed,
    /// An event with sequence `u64::MAX`: sequences stop below it, so `tail + 1` always exists.
    SequenceOverflow {
        stream: StreamId,
    },
    /// A key record's payload is malformed or it names events its stream does not hold.
    KeyInvalid,
}

/// Why an append (or `create_stream`) failed. Nothing was appended when it fails.
#[derive(Debug)]
pub enum AppendError {
    UnknownStream(StreamId),
    /// The stream was removed ([`Log::remove_stream`]); ids are never reused.
    StreamRemoved(StreamId),
    /// The event type contains CR or LF.
    EventTypeHasLineBreak,
    /// The data is not UTF-8 (SSE streams are UTF-8).
    DataNotUtf8 {
        valid_up_to: usize,
    },
    RecordTooLarge {
        framed_bytes: usize,
        record_bytes_max: u32,
    },
    /// Empty, longer than `STREAM_NAME_BYTES_MAX`, or containing a control character.
    StreamNameInvalid(&'static str),
    TooManyStreams,
    /// No space for a new segment (`posix_fallocate` said ENOSPC). Retry after retention.
    DiskFull,
    /// An fsync failed earlier; the log refuses writes (reopen to recover from disk).
    Poisoned,
    /// The stream's next sequence would be `u64::MAX` (never a valid sequence).
    SequenceExhausted(StreamId),
    /// The active segment is numbered `u64::MAX`: no segment can follow it.
    SegmentNumbersExhausted,
    /// A key record ([`Log::append_key`]) names no event, events the stream does not hold,
    /// or its key is empty or too long.
    KeyInvalid(&'static str),
    Io(io::Error),
}

/// Why a sync failed. After a failed fsync the log is poisoned (the kernel may have dropped the
/// dirty pages, so retrying could report success for lost data).
#[derive(Debug)]
pub enum SyncError {
    Io(io::Error),
    Poisoned,
}

/// Why a retention pass failed. Nothing was deleted when it fails.
#[derive(Debug)]
pub enum RetentionError {
    Sync(SyncError),
    Io { path: PathBuf, source: io::Error },
}

macro_rules! impl_error {
    ($t:ty) => {
        impl std::error::Error for $t {}
    };
}
impl_error!(OpenError);
impl_error!(AppendError);
impl_error!(SyncError);
impl_error!(RetentionError);
impl_error!(ReadError);

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpenError::Options(e) => write!(f, "bad log options: {e}"),
            OpenError::Io { path, source } => write!(f, "{}: {source}", path.display()),
            OpenError::Locked { path } => write!(f, "{} is locked by another log", path.display()),
            OpenError::Random(e) => write!(f, "cannot draw a random epoch: {e}"),
            OpenError::Checkpoint { path, reason } => {
                write!(f, "{}: bad checkpoint: {reason:?}", path.display())
            }
            OpenError::BadSegmentSize { path, bytes } => {
                write!(f, "{}: segment size {bytes} is invalid", path.display())
            }
            OpenError::BadHeader { path, reason } => {
                write!(f, "{}: bad segment header: {reason:?}", path.display())
            }
            OpenError::HeaderMismatch {
                path,
                field,
                expected,
                found,
            } => write!(
                f,
                "{}: header {field} is {found}, expected {expected}",
                path.display()
            ),
            OpenError::MissingSegment { number } => write!(f, "segment {number} is missing"),
            OpenError::Corrupt {
                path,
                offset,
                reason,
            } => {
                write!(
                    f,
                    "{}: corrupt record at byte {offset}: {reason:?}",
                    path.display()
                )
            }
        }
    }
}

impl fmt::Display for AppendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AppendError::UnknownStream(s) => write!(f, "unknown stream {s}"),
            AppendError::StreamRemoved(s) => write!(f, "stream {s} was removed"),
            AppendError::EventTypeHasLineBreak => write!(f, "event type contains CR or LF"),
            AppendError::DataNotUtf8 { valid_up_to } => {
                write!(
                    f,
                    "event data is not UTF-8 (valid up to byte {valid_up_to})"
                )
            }
            AppendError::RecordTooLarge {
                framed_bytes,
                record_bytes_max,
            } => write!(
                f,
                "framed record of {framed_bytes} bytes exceeds record_bytes_max {record_bytes_max}"
            ),
            AppendError::StreamNameInvalid(why) => write!(f, "invalid stream name: {why}"),
            AppendError::TooManyStreams => write!(f, "too many streams"),
            AppendError::DiskFull => write!(f, "disk full: cannot allocate a new segment"),
            AppendError::Poisoned => write!(f, "log is poisoned by an earlier fsync failure"),
            AppendError::SequenceExhausted(s) => write!(f, "stream {s} has used every sequence"),
            AppendError::SegmentNumbersExhausted => write!(f, "no segment number left"),
            AppendError::KeyInvalid(why) => write!(f, "key record refused: {why}"),
            AppendError::Io(e) => write!(f, "log write failed: {e}"),
        }
    }
}

impl fmt::Display for SyncError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SyncError::Io(e) => write!(f, "fsync failed: {e}"),
            SyncError::Poisoned => write!(f, "log is poisoned by an earlier fsync failure"),
        }
    }
}

impl fmt::Display for RetentionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RetentionError::Sync(e) => write!(f, "retention: {e}"),
            RetentionError::Io { path, source } => {
                write!(f, "retention: {}: {source}", path.display())
            }
        }
    }
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadError::UnknownStream => write!(f, "unknown stream"),
            ReadError::StreamRemoved => write!(f, "stream was removed"),
            ReadError::Truncated {
                requested,
                floor,
                tail,
            } => write!(
                f,
                "sequence {requested} was deleted (retained {floor}..={tail})"
            ),
            ReadError::BeyondTail { requested, tail } => {
                write!(f, "sequence {requested} is beyond the tail {tail}")
            }
        }
    }
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> OpenError + '_ {
    move |source| OpenError::Io {
        path: path.to_owned(),
        source,
    }
}

// ---------------------------------------------------------------------------------------------
// Segments
// ---------------------------------------------------------------------------------------------

/// One segment file and its mapping. Dropped (unmapped, and unlinked if retention removed it)
/// when the last `Arc` — the log's or a `LogSlice`'s — goes.
#[derive(Debug)]
struct Segment {
    number: u64,
    path: PathBuf,
    unlink_on_drop: AtomicBool,
    /// The mapping, the file and the directory lock; `None` only once dropped (retired).
    parts: Option<SegParts>,
}

#[derive(Debug)]
struct SegParts {
    map: SharedMap,
    file: File,
    /// The directory lock: held while any segment (hence any `LogSlice`) of the log lives, so
    /// no new `Log` can open the directory and recycle or rewrite files that slices still map.
    lock: Arc<File>,
}

impl Segment {
    fn new(number: u64, path: PathBuf, map: SharedMap, file: File, lock: Arc<File>) -> Segment {
        Segment {
            number,
            path,
            unlink_on_drop: AtomicBool::new(false),
            parts: Some(SegParts { map, file, lock }),
        }
    }

    fn map(&self) -> &SharedMap {
        &self.parts.as_ref().expect("a live segment").map
    }

    fn file(&self) -> &File {
        &self.parts.as_ref().expect("a live segment").file
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        let SegParts { map, file, lock } = self.parts.take().expect("dropped once");
        let unlink = self
            .unlink_on_drop
            .load(Ordering::Acquire)
            .then(|| self.path.clone());
        retire::retire(retire::Retired {
            _map: map,
            _file: file,
            unlink,
            _lock: lock,
        });
    }
}

#[derive(Debug)]
struct SegMeta {
    seg: Arc<Segment>,
    bytes: u64,
    newest_ts_ms: u64,
    /// Streams with at least one event in this segment.
    streams: Vec<StreamId>,
}

/// Write state of the last segment.
#[derive(Debug)]
struct Active {
    tok: WriteToken,
    data_end: usize,
    entry_low: usize,
    entries: u64,
    sealed: bool,
    /// The segment's header version (1: written before stream removal existed; no removal
    /// record may go into it).
    version: u32,
    /// CRC of the last entry written (the header's CRC before the first): the next entry's seed.
    chain: u32,
    /// Pages of `[data_end, populated_high)` and `[populated_low, entry_low)` are faulted in
    /// ahead of the writer (`POPULATE_AHEAD_BYTES` at a time).
    populated_high: usize,
    populated_low: usize,
    /// Where the segment's header stands (DESIGN.md "Segment roll").
    header: HeaderState,
    /// Once fewer bytes than this are free, the next segment's preparation is requested
    /// (half the segment; 0 once requested).
    prepare_below: usize,
}

impl Active {
    /// The write state of a new, empty segment of `bytes` whose header CRC is `chain`;
    /// `populated`: its first chunk at both ends is faulted in writable already.
    fn fresh(
        tok: WriteToken,
        bytes: u64,
        chain: u32,
        header: HeaderState,
        populated: bool,
    ) -> Active {
        let len = bytes as usize;
        let ahead = if populated { POPULATE_AHEAD_BYTES } else { 0 };
        Active {
            tok,
            data_end: HEADER_BYTES,
            entry_low: len,
            entries: 0,
            sealed: false,
            version: SEGMENT_VERSION,
            chain,
            populated_high: (HEADER_BYTES + ahead).min(len),
            populated_low: len.saturating_sub(ahead).max(HEADER_BYTES),
            header,
            prepare_below: len / 2,
        }
    }
}

/// The active segment's header. A segment's header may reach the disk only after the previous
/// segment's seal did (else a crash could leave a valid next segment behind a previous one
/// without its seal or records: DESIGN.md C6/C7). Inline rolls flush the sealed segment first;
/// background-mode rolls defer the header instead, so no roll waits for the disk.
#[derive(Debug)]
enum HeaderState {
    /// On disk (flushed), or the policy is `never`.
    Durable,
    /// Not written (zero in the file): the previous segment's seal is not known durable yet.
    /// Written when a sync that began after the roll completes. Records go in meanwhile but are
    /// not frozen (the header is still private) and not made visible.
    Waiting([u8; HEADER_BYTES]),
    /// Written into the mapping; durable once a sync that began after that completes.
    Written,
}

/// How far ahead of the writer pages are faulted in, per side. Small enough that one populate
/// (~64 pages) stalls the writer for well under a millisecond; a whole 64 MiB segment at once
/// took 14-24 ms on the test VM.
pub(crate) const POPULATE_AHEAD_BYTES: usize = 256 * 1024;

/// Location of one record: segment number (low 32 bits), offset, framed length.
#[derive(Debug, Clone, Copy)]
struct Loc {
    seg: u32,
    off: u32,
    len: u32,
}

fn segment_path(dir: &Path, number: u64) -> PathBuf {
    dir.join(format!("{number:020}{SEGMENT_SUFFIX}"))
}

fn now_unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

// ---------------------------------------------------------------------------------------------
// The log
// ---------------------------------------------------------------------------------------------

/// A segmented append log of pre-framed SSE records shared by many streams.
pub struct Log {
    dir: PathBuf,
    opts: LogOptions,
    epoch: Epoch,
    segs: VecDeque<SegMeta>,
    active: Active,
    streams: Streams,
    /// Streams with appends not yet visible (policies other than `Never`); removed ones are
    /// skipped when the marks are taken.
    dirty: Vec<StreamId>,
    /// Removals written since the last `begin_sync` (policies other than `Never`).
    unsynced_removals: Vec<StreamId>,
    /// When the oldest unsynced write happened.
    unsynced_since: Option<Instant>,
    /// Number of the oldest segment written since the last flush (any policy).
    unflushed_from: Option<u64>,
    poisoned: bool,
    /// The group commit in flight (`begin_sync` … `finish_sync`).
    syncing: Option<Syncing>,
    /// A retired segment's file (`SPARE_FILE`) waits to be reused by the next roll (inline
    /// mode; with `bg` the background thread owns the spare).
    spare: bool,
    /// Segment preparation and retention checkpoints off this thread (`None`: inline).
    bg: Option<background::Background>,
    /// Sync outcomes waiting for the active segment's header to be durable.
    held: Held,
    rolls: RollCounts,
    /// Dropped as by a crash (test hook `simulate_crash`).
    abandon: bool,
    recovery: RecoveryReport,
    /// Key records found by recovery, until taken ([`Log::take_recovered_keys`]).
    recovered_keys: Vec<keys::KeyRecord>,
    lock: Arc<File>,
}

impl fmt::Debug for Log {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Log")
            .field("dir", &self.dir)
            .field("epoch", &self.epoch)
            .field("segments", &self.segs.len())
            .field("streams", &self.streams.ids())
            .field("live_streams", &self.streams.live_count())
            .field("poisoned", &self.poisoned)
            .finish()
    }
}

impl Log {
    /// Opens the log in `dir`: creates it (new random epoch) when the directory holds no log,
    /// else recovers it (see DESIGN.md "Recovery").
    ///
    /// When [`prepare_in_background`] ran earlier in the process, the log prepares its next
    /// segment and writes its retention checkpoints on that thread (DESIGN.md "Segment roll",
    /// "Retention and pinning"); otherwise on the caller's thread.
    pub fn open(dir: &Path, opts: LogOptions) -> Result<Log, OpenError> {
        opts.validate().map_err(OpenError::Options)?;
        crate::log::recover::open(dir, opts, background::Executor::started())
    }

    /// Whether an fsync failed: the log then refuses appends and syncs until it is reopened
    /// (recovery decides what of it is there), and nothing more becomes visible.
    pub fn is_poisoned(&self) -> bool {
        self.poisoned
    }

    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    pub fn options(&self) -> &LogOptions {
        &self.opts
    }

    /// What recovery found when this log was opened.
    pub fn recovery(&self) -> &RecoveryReport {
        &self.recovery
    }

    /// The live stream named `name` (a removed stream's name maps to nothing).
    pub fn stream_id(&self, name: &str) -> Option<StreamId> {
        self.streams.id_of(name)
    }

    /// The name of live stream `id`; `None` when unknown or removed.
    pub fn stream_name(&self, id: StreamId) -> Option<&str> {
        self.streams.get(id).map(|s| &*s.name)
    }

    /// Number of stream ids ever created, removed streams included (the next stream's id).
    /// [`Log::live_stream_count`] counts the live ones.
    pub fn stream_count(&self) -> usize {
        self.streams.ids()
    }

    /// Live streams in id order (removed ones are skipped).
    pub fn streams(&self) -> impl Iterator<Item = (StreamId, &str, Bounds)> + '_ {
        self.streams.iter().map(|s| (s.id, &*s.name, s.bounds()))
    }

    /// Bounds of live stream `stream`; `None` when unknown or removed.
    pub fn bounds(&self, stream: StreamId) -> Option<Bounds> {
        self.streams.get(stream).map(StreamState::bounds)
    }

    /// Creates the stream `name` (idempotent: an existing name returns its id). A name whose
    /// stream was removed gets a new id.
    pub fn create_stream(&mut self, name: &str) -> Result<StreamId, AppendError> {
        self.create_stream_after(name, 0)
    }

    /// [`Log::create_stream`] for a stream whose first event here is `tail + 1`: it starts
    /// with floor `tail + 1` (a replica bootstrapped from a snapshot of another log, whose
    /// earlier events it does not hold: a resume below is `Truncated`, never served). The
    /// *stream name* record carries `tail`, so recovery restores it. An existing name returns
    /// its id whatever its tail.
    pub fn create_stream_after(&mut self, name: &str, tail: Seq) -> Result<StreamId, AppendError> {
        if let Some(id) = self.streams.id_of(name) {
            return Ok(id);
        }
        if tail >= u64::MAX - 1 {
            return Err(AppendError::SequenceExhausted(StreamId(
                self.streams.ids() as u32
            )));
        }
        if self.poisoned {
            return Err(AppendError::Poisoned);
        }
        validate_stream_name(name)?;
        let id = u32::try_from(self.streams.ids()).map_err(|_| AppendError::TooManyStreams)?;
        if id == u32::MAX {
            return Err(AppendError::TooManyStreams);
        }
        let id = StreamId(id);
        self.ensure_room(name.len())?;
        let ts = mmap::coarse_unix_ms();
        self.write_record(Kind::StreamName, id, tail, ts, name.len(), |buf| {
            buf.copy_from_slice(name.as_bytes())
        });
        self.streams.push_live(StreamState::new(
            self.epoch,
            id,
            name.into(),
            tail + 1,
            tail,
        ));
        Ok(id)
    }

    /// Whether `name` may name a stream (what [`Log::create_stream`] checks first).
    pub fn check_stream_name(name: &str) -> Result<(), AppendError> {
        validate_stream_name(name)
    }

    /// Frames the event as SSE once and appends it to `stream`.
    pub fn append(
        &mut self,
        stream: StreamId,
        event_type: Option<&str>,
        data: &[u8],
    ) -> Result<Appended, AppendError> {
        if self.poisoned {
            return Err(AppendError::Poisoned);
        }
        let st = match self.streams.lookup(stream) {
            Lookup::Live(_) => &self.streams[stream],
            Lookup::Removed { .. } => return Err(AppendError::StreamRemoved(stream)),
            Lookup::Unknown => return Err(AppendError::UnknownStream(stream)),
        };
        check_event(event_type, data)?;
        // Sequences stop below u64::MAX (recovery refuses it), so `tail + 1` never overflows.
        if st.tail >= u64::MAX - 1 {
            return Err(AppendError::SequenceExhausted(stream));
        }
        let seq = st.tail + 1;
        let id = EventId {
            epoch: self.epoch,
            stream,
            seq,
        };
        let lines = frame::split(data);
        let framed_bytes = frame::framed_len(&st.id_prefix, seq, event_type, data, lines);
        if framed_bytes > self.opts.record_bytes_max as usize {
            return Err(AppendError::RecordTooLarge {
                framed_bytes,
                record_bytes_max: self.opts.record_bytes_max,
            });
        }
        self.ensure_room_for_event(framed_bytes)?;
        let ts = mmap::coarse_unix_ms();
        // Borrow the prefix out of the stream for the duration of the write (no allocation).
        let prefix = std::mem::take(&mut self.streams[stream].id_prefix);
        let loc = self.write_record(Kind::Event, stream, seq, ts, framed_bytes, |buf| {
            frame::write_frame(buf, &prefix, seq, event_type, data, lines)
        });
        self.streams[stream].id_prefix = prefix;
        let meta = self.segs.back_mut().expect("active segment");
        let seg_number = meta.seg.number;
        let st = &mut self.streams[stream];
        if st.last_seg != Some(seg_number) {
            st.last_seg = Some(seg_number);
            meta.streams.push(stream);
        }
        st.index.push_back(loc);
        st.tail = seq;
        let durable = if self.opts.fsync == FsyncPolicy::Never {
            st.visible = seq;
            true
        } else {
            if !st.dirty {
                st.dirty = true;
                self.dirty.push(stream);
            }
            false
        };
        debug_assert_eq!(st.index.len() as u64, st.tail + 1 - st.floor);
        Ok(Appended { id, durable })
    }

    /// The number of the segment appends go to (its pages are hot: a reader of an older one
    /// may be reading cold pages).
    pub fn active_segment(&self) -> u64 {
        self.segs.back().expect("active segment").seg.number
    }

    /// Up to `bytes_max` bytes (at least one whole record) of `stream`'s records from `from`
    /// through the visible tail, as mapped slices; records adjacent in a segment are coalesced.
    /// `from = 0` means from the first event (sequence 1).
    pub fn read(
        &self,
        stream: StreamId,
        from: Seq,
        bytes_max: usize,
    ) -> Result<ReadBatch, ReadError> {
        let mut batch = ReadBatch::default();
        self.read_into(stream, from, bytes_max, &mut batch)?;
        Ok(batch)
    }

    /// [`Log::read`] into `batch` (cleared first), reusing its vectors' memory: a server
    /// reading one record per subscriber per event allocates nothing here.
    pub fn read_into(
        &self,
        stream: StreamId,
        from: Seq,
        bytes_max: usize,
        batch: &mut ReadBatch,
    ) -> Result<(), ReadError> {
        batch.slices.clear();
        batch.record_lens.clear();
        let st = self.live_for_read(stream)?;
        let from = self.check_from(st, from)?;
        batch.first = from;
        batch.last = from - 1;
        if from > st.visible {
            return Ok(());
        }
        let start = (from - st.floor) as usize;
        let end = (st.visible + 1 - st.floor) as usize;
        let mut total = 0usize;
        let mut run: Option<(Loc, Seq)> = None;
        for (i, loc) in st.index.range(start..end).enumerate() {
            let len = loc.len as usize;
            if total > 0 && total + len > bytes_max {
                break;
            }
            total += len;
            batch.record_lens.push(loc.len);
            let seq = from + i as u64;
            match &mut run {
                Some((r, _)) if r.seg == loc.seg && r.off + r.len == loc.off => r.len += loc.len,
                _ => {
                    if let Some((r, first)) = run.take() {
                        batch.slices.push(self.slice(r, first, seq - 1));
                    }
                    run = Some((*loc, seq));
                }
            }
            batch.last = seq;
        }
        if let Some((r, first)) = run {
            batch.slices.push(self.slice(r, first, batch.last));
        }
        Ok(())
    }

    /// Framed bytes of one visible record.
    pub fn record(&self, stream: StreamId, seq: Seq) -> Result<LogSlice, ReadError> {
        let st = self.live_for_read(stream)?;
        let seq = self.check_from(st, seq)?;
        if seq > st.visible {
            return Err(ReadError::BeyondTail {
                requested: seq,
                tail: st.visible,
            });
        }
        Ok(self.slice(st.index[(seq - st.floor) as usize], seq, seq))
    }

    // ----- internals -----

    fn live_for_read(&self, stream: StreamId) -> Result<&StreamState, ReadError> {
        match self.streams.lookup(stream) {
            Lookup::Live(_) => Ok(&self.streams[stream]),
            Lookup::Removed { .. } => Err(ReadError::StreamRemoved),
            Lookup::Unknown => Err(ReadError::UnknownStream),
        }
    }

    fn check_from(&self, st: &StreamState, from: Seq) -> Result<Seq, ReadError> {
        let from = from.max(1);
        debug_assert!(st.floor <= st.visible + 1);
        if from < st.floor {
            return Err(ReadError::Truncated {
                requested: from,
                floor: st.floor,
                tail: st.visible,
            });
        }
        if from > st.visible + 1 {
            return Err(ReadError::BeyondTail {
                requested: from,
                tail: st.visible,
            });
        }
        Ok(from)
    }

    fn slice(&self, loc: Loc, first_seq: Seq, last_seq: Seq) -> LogSlice {
        let first_number = self.segs[0].seg.number;
        let idx = loc.seg.wrapping_sub(first_number as u32) as usize;
        let seg = Arc::clone(&self.segs[idx].seg);
        debug_assert_eq!(seg.number as u32, loc.seg);
        LogSlice {
            seg,
            off: loc.off,
            len: loc.len,
            first_seq,
            last_seq,
        }
    }

    /// Faults pages in ahead of both growing ends of the active segment (the data reaching
    /// `data_end`, the entries reaching down to `entry_off`), a chunk at a time, so no single
    /// append pays for a whole segment's page faults (see POPULATE_AHEAD_BYTES). In background
    /// mode the `log-prepare` thread does it while the writer still has half a chunk to go.
    fn populate_ahead(&mut self, data_end: usize, entry_off: usize) {
        let seg = &self.segs.back().expect("active segment").seg;
        let a = &mut self.active;
        let populate = |off: usize, len: usize| match &self.bg {
            Some(bg) => bg.populate(seg, off, len),
            None => seg.map().populate(off, len),
        };
        while a.populated_high < data_end + POPULATE_AHEAD_BYTES / 2
            && a.populated_high < a.populated_low
        {
            populate(a.populated_high, POPULATE_AHEAD_BYTES);
            a.populated_high += POPULATE_AHEAD_BYTES;
        }
        while a.populated_low > entry_off.saturating_sub(POPULATE_AHEAD_BYTES / 2)
            && a.populated_low > a.populated_high
        {
            let from = a.populated_low.saturating_sub(POPULATE_AHEAD_BYTES);
            populate(from, a.populated_low - from);
            a.populated_low = from;
        }
    }

    /// Writes payload + entry into the active segment (room already ensured) and freezes the
    /// payload. Returns the payload's location.
    fn write_record(
        &mut self,
        kind: Kind,
        stream: StreamId,
        seq: Seq,
        timestamp_ms: u64,
        len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> Loc {
        let off = self.active.data_end;
        let entry_off = self.active.entry_low - ENTRY_BYTES;
        assert!(off + len <= entry_off, "record overlaps the entry area");
        self.populate_ahead(off + len, entry_off);
        let meta = self.segs.back_mut().expect("active segment");
        let map = meta.seg.map();
        let a = &mut self.active;
        fill(map.private_mut(&mut a.tok, off, len));
        let entry = Entry {
            len: len as u32,
            data_off: off as u32,
            stream,
            seq,
            timestamp_ms,
            kind,
        }
        .encode(a.chain, map.read_private(&a.tok, off, len));
        a.chain = Entry::crc(&entry);
        map.private_mut(&mut a.tok, entry_off, ENTRY_BYTES)
            .copy_from_slice(&entry);
        a.entry_low = entry_off;
        a.data_end = off + len;
        a.entries += 1;
        // Keep the slot below the lowest entry zero: it marks the end for recovery even in a
        // recycled file whose old bytes are still there (it is free space, or data has reached
        // it and the scan stops for lack of room).
        if let Some(below) = entry_off.checked_sub(ENTRY_BYTES)
            && below >= a.data_end
        {
            let slot = map.private_mut(&mut a.tok, below, ENTRY_BYTES);
            if slot.iter().any(|&b| b != 0) {
                slot.fill(0);
            }
        }
        if !matches!(a.header, HeaderState::Waiting(_)) {
            // (A deferred header keeps the segment private until it is written.)
            map.freeze(&mut a.tok, a.data_end);
        }
        if timestamp_ms > meta.newest_ts_ms {
            meta.newest_ts_ms = timestamp_ms;
        }
        let number = meta.seg.number;
        if self.unflushed_from.is_none() {
            self.unflushed_from = Some(number);
        }
        if self.opts.fsync != FsyncPolicy::Never && self.unsynced_since.is_none() {
            self.unsynced_since = Some(Instant::now());
        }
        Loc {
            seg: number as u32,
            off: off as u32,
            len: len as u32,
        }
    }
}

/// An event's type may not break its `event:` line, and its data must be UTF-8 (SSE is text).
fn check_event(event_type: Option<&str>, data: &[u8]) -> Result<(), AppendError> {
    if let Some(t) = event_type
        && t.bytes().any(|b| b == b'\r' || b == b'\n')
    {
        return Err(AppendError::EventTypeHasLineBreak);
    }
    if let Err(e) = std::str::from_utf8(data) {
        return Err(AppendError::DataNotUtf8 {
            valid_up_to: e.valid_up_to(),
        });
    }
    Ok(())
}

fn validate_stream_name(name: &str) -> Result<(), AppendError> {
    if name.is_empty() {
        return Err(AppendError::StreamNameInvalid("empty"));
    }
    if name.len() > STREAM_NAME_BYTES_MAX {
        return Err(AppendError::StreamNameInvalid(
            "longer than STREAM_NAME_BYTES_MAX bytes",
        ));
    }
    if name.chars().any(char::is_control) {
        return Err(AppendError::StreamNameInvalid(
            "contains a control character",
        ));
    }
    Ok(())
}

impl LogSlice {
    pub fn as_bytes(&self) -> &[u8] {
        self.seg
            .map()
            .read_frozen(self.off as usize, self.len as usize)
    }
    pub fn first_seq(&self) -> Seq {
        self.first_seq
    }
    pub fn last_seq(&self) -> Seq {
        self.last_seq
    }
    pub fn len(&self) -> usize {
        self.len as usize
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn as_ptr(&self) -> *const u8 {
        self.as_bytes().as_ptr()
    }
    /// Number of the segment this slice points into (diagnostics).
    pub fn segment_number(&self) -> u64 {
        self.seg.number
    }

    /// The segment file holding the slice (to read it ahead of a send: see `file_offset`).
    pub fn file(&self) -> BorrowedFd<'_> {
        self.seg.file().as_fd()
    }

    /// Where the slice's first byte lies in its segment file.
    pub fn file_offset(&self) -> u64 {
        u64::from(self.off)
    }
}

impl fmt::Debug for LogSlice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LogSlice")
            .field("segment", &self.seg.number)
            .field("off", &self.off)
            .field("len", &self.len)
            .field("seqs", &(self.first_seq..=self.last_seq))
            .finish()
    }
}

impl ReadBatch {
    pub fn is_empty(&self) -> bool {
        self.last < self.first
    }
    /// Total framed bytes in the batch.
    pub fn bytes(&self) -> usize {
        self.slices.iter().map(LogSlice::len).sum()
    }
}

mod background;
mod keys;
mod recover;
mod retention;
pub(crate) mod retire;
mod roll;
mod segfile;
mod streams;
mod sync;

pub use background::prepare_in_background;
pub use keys::{KEY_BYTES_MAX, KeyRecord};
