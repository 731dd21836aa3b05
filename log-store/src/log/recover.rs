//! Opening a log directory: create a new log (fresh random epoch), or recover an existing one —
//! load the checkpoint, delete stale segments below it, scan every segment in order verifying
//! chained CRCs, cut the torn tail of the last (active) segment, refuse damage anywhere else,
//! and rebuild stream names, indexes, floors and tails. No appends happen here.
#![forbid(unsafe_code)]

use super::background::{Background, Executor};
use super::segfile::{self, Stamp, live_segments};
use super::streams::Lookup;
use super::*;
use crate::options::{SEGMENT_BYTES_MAX, SEGMENT_BYTES_MIN};

impl Log {
    /// Test hook: opens the log in background mode with jobs queued instead of run; they run
    /// only in [`Log::run_background_jobs`] (or never: a crash at that point).
    #[doc(hidden)]
    pub fn open_with_manual_background(dir: &Path, opts: LogOptions) -> Result<Log, OpenError> {
        opts.validate().map_err(OpenError::Options)?;
        open(dir, opts, Some(Executor::manual()))
    }
}

pub(super) fn open(dir: &Path, opts: LogOptions, exec: Option<Executor>) -> Result<Log, OpenError> {
    let lock = lock_dir(dir)?;
    let mut report = RecoveryReport::default();
    let ckpt_path = dir.join(CHECKPOINT_FILE);
    let ckpt = load_checkpoint(dir, &ckpt_path)?;
    let first_live = ckpt.as_ref().map_or(0, |c| c.first_live_segment);
    let numbers = live_segments(dir, first_live, &mut report)?;
    if numbers.is_empty() {
        if ckpt.is_some() {
            return Err(OpenError::MissingSegment { number: first_live });
        }
        return create_new(dir, opts, lock, report, exec);
    }
    check_contiguous(&numbers, first_live)?;

    let mut scan = Scan::new(ckpt.as_ref(), &ckpt_path, Arc::clone(&lock), report)?;

    let mut segs = VecDeque::with_capacity(numbers.len());
    let mut active = None;
    for (pos, &number) in numbers.iter().enumerate() {
        let last = pos + 1 == numbers.len();
        let (meta, tail) = scan.segment(dir, number, last)?;
        segs.push_back(meta);
        if last {
            active = Some(tail);
        }
    }
    let Scan {
        epoch,
        mut streams,
        mut report,
        ckpt_tails,
        keys,
        ..
    } = scan;
    let epoch = epoch.expect("at least one segment was scanned");

    settle_tails(&mut streams, &ckpt_tails, &mut report);

    let (active, sealed_last) = active.expect("last segment scanned");
    let mut log = Log {
        dir: dir.to_owned(),
        opts,
        epoch,
        segs,
        active,
        streams,
        dirty: Vec::new(),
        unsynced_removals: Vec::new(),
        unsynced_since: None,
        unflushed_from: Some(first_live),
        poisoned: false,
        syncing: None,
        spare: false,
        bg: exec.map(Background::new),
        held: Held::default(),
        rolls: RollCounts::default(),
        abandon: false,
        recovery: RecoveryReport::default(),
        recovered_keys: keys,
        lock,
    };
    settle_recovered(&mut log, dir, sealed_last)?;
    log.recovery = report;
    Ok(log)
}

/// The live segments are numbered `first_live`, `first_live + 1`, ... without a hole.
fn check_contiguous(numbers: &[u64], first_live: u64) -> Result<(), OpenError> {
    if numbers[0] != first_live {
        return Err(OpenError::MissingSegment { number: first_live });
    }
    for w in numbers.windows(2) {
        if w[1] != w[0] + 1 {
            return Err(OpenError::MissingSegment { number: w[0] + 1 });
        }
    }
    Ok(())
}

/// Makes a recovered log durable and, if its last segment is sealed, rolls to a new one.
fn settle_recovered(log: &mut Log, dir: &Path, sealed_last: bool) -> Result<(), OpenError> {
    // Whatever recovery found is made durable now, so it may be shown to readers at once.
    log.sync_now().map_err(|e| match e {
        SyncError::Io(source) => OpenError::Io {
            path: dir.to_owned(),
            source,
        },
        SyncError::Poisoned => unreachable!("fresh log is not poisoned"),
    })?;
    if sealed_last {
        match log.roll() {
            Ok(()) => {}
            // A full disk must not keep the log from being read: stay sealed; every append
            // retries the roll (and reports DiskFull) until retention or the operator frees space.
            Err(AppendError::DiskFull) => {}
            // Likewise a sealed last segment numbered u64::MAX (only a forged directory): the
            // log stays readable; appends report SegmentNumbersExhausted.
            Err(AppendError::SegmentNumbersExhausted) => {}
            Err(e) => return Err(append_to_open(dir, e)),
        }
    }
    Ok(())
}

/// Locks this process still holds through a dropped `Log`: the log is gone, but a segment
/// of it (a `LogSlice`, the `log-retire` queue) or a preparation the `log-prepare` thread is
/// finishing keeps the lock file open for a moment. By (device, inode) of the lock file, a
/// weak reference to it.
static RELEASING: std::sync::Mutex<Vec<Releasing>> = std::sync::Mutex::new(Vec::new());

/// (device, inode) of a lock file, and the dropped log's reference to it.
type Releasing = ((u64, u64), std::sync::Weak<File>);

/// How long `Log::open` waits for a dropped log of this process to release the directory.
const RELEASE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Called as a `Log` drops: its lock, if still referenced elsewhere, is being released.
pub(super) fn releasing(lock: &Arc<File>) {
    use std::os::unix::fs::MetadataExt as _;
    let Ok(m) = lock.metadata() else { return };
    let mut r = RELEASING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    r.retain(|(_, w)| w.strong_count() > 0);
    r.push(((m.dev(), m.ino()), Arc::downgrade(lock)));
}

/// Waits (bounded) until no dropped log of this process holds `lock`'s file; false if none
/// did (another `Log` or another process holds it).
fn wait_for_release(lock: &File) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    let Ok(m) = lock.metadata() else { return false };
    let key = (m.dev(), m.ino());
    let weak = {
        let r = RELEASING
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        r.iter()
            .find(|(k, w)| *k == key && w.strong_count() > 0)
            .map(|(_, w)| w.clone())
    };
    let Some(weak) = weak else { return false };
    let deadline = std::time::Instant::now() + RELEASE_WAIT;
    while weak.strong_count() > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    true
}

/// Creates `dir` if needed and takes its lock (`flock` on `LOCK`). A lock a dropped `Log` of
/// this process is still releasing is waited for (up to `RELEASE_WAIT`); a live `Log`'s or
/// another process's is `Locked` at once.
fn lock_dir(dir: &Path) -> Result<Arc<File>, OpenError> {
    fs::create_dir_all(dir).map_err(io_err(dir))?;
    let lock_path = dir.join(LOCK_FILE);
    let lock = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&lock_path)
        .map_err(io_err(&lock_path))?;
    let mut waited = false;
    loop {
        match lock.try_lock() {
            Ok(()) => return Ok(Arc::new(lock)),
            Err(fs::TryLockError::WouldBlock) if !waited && wait_for_release(&lock) => {
                waited = true;
            }
            Err(fs::TryLockError::WouldBlock) => {
                return Err(OpenError::Locked {
                    path: dir.to_owned(),
                });
            }
            Err(fs::TryLockError::Error(e)) => return Err(io_err(&lock_path)(e)),
        }
    }
}

/// Deletes the transient files (a checkpoint being written, the spare) and loads the
/// checkpoint, if any.
fn load_checkpoint(dir: &Path, ckpt_path: &Path) -> Result<Option<Checkpoint>, OpenError> {
    for transient in [CHECKPOINT_TMP_FILE, SPARE_FILE] {
        let p = dir.join(transient);
        match fs::remove_file(&p) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(io_err(&p)(e)),
            _ => {}
        }
    }
    match fs::read(ckpt_path) {
        Ok(b) => Checkpoint::decode(&b)
            .map(Some)
            .map_err(|reason| OpenError::Checkpoint {
                path: ckpt_path.to_owned(),
                reason,
            }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err(ckpt_path)(e)),
    }
}

/// After the scan: a checkpointed stream whose recovered tail is below its checkpointed one
/// continues past it (recovery step 6); then every recovered record is visible.
fn settle_tails(streams: &mut Streams, ckpt_tails: &[Seq], report: &mut RecoveryReport) {
    for (i, &ckpt_tail) in ckpt_tails.iter().enumerate() {
        let Some(st) = streams.get_mut(StreamId(i as u32)) else {
            continue; // removed
        };
        if st.tail < ckpt_tail {
            // The checkpoint saw records the disk lost (power loss under `Never`). Sequences up
            // to `ckpt_tail` may have been seen by readers: never reuse them, and serve nothing
            // of the stream's present records as if it were contiguous with them.
            st.index.clear();
            st.floor = ckpt_tail + 1;
            st.tail = ckpt_tail;
            if !report
                .streams_behind_checkpoint
                .contains(&StreamId(i as u32))
            {
                report.streams_behind_checkpoint.push(StreamId(i as u32));
            }
        }
    }
    for st in streams.iter_live_mut() {
        st.visible = st.tail;
        debug_assert_eq!(st.index.len() as u64, st.tail + 1 - st.floor);
    }
    streams.shrink_slots();
}

fn append_to_open(dir: &Path, e: AppendError) -> OpenError {
    let source = match e {
        AppendError::Io(e) => e,
        AppendError::DiskFull => io::Error::from_raw_os_error(libc::ENOSPC),
        other => io::Error::other(other.to_string()),
    };
    OpenError::Io {
        path: dir.to_owned(),
        source,
    }
}

fn create_new(
    dir: &Path,
    opts: LogOptions,
    lock: Arc<File>,
    mut report: RecoveryReport,
    exec: Option<Executor>,
) -> Result<Log, OpenError> {
    let epoch = match opts.epoch_on_create {
        Some(e) => e,
        None => {
            let mut raw = [0u8; 8];
            getrandom::fill(&mut raw).map_err(OpenError::Random)?;
            Epoch(u64::from_le_bytes(raw).max(1))
        }
    };
    let bytes = opts.segment_bytes;
    let (meta, active) = segfile::create_file(dir, 0, bytes, false, true, false)
        .and_then(|f| segfile::install(f, epoch, bytes, Stamp::Now { flush: true }, &lock))
        .map_err(|e| append_to_open(dir, e))?;
    report.created = true;
    Ok(Log {
        dir: dir.to_owned(),
        opts,
        epoch,
        segs: VecDeque::from([meta]),
        active,
        streams: Streams::default(),
        dirty: Vec::new(),
        unsynced_removals: Vec::new(),
        unsynced_since: None,
        unflushed_from: None,
        poisoned: false,
        syncing: None,
        spare: false,
        bg: exec.map(Background::new),
        held: Held::default(),
        rolls: RollCounts::default(),
        abandon: false,
        recovery: report,
        recovered_keys: Vec::new(),
        lock,
    })
}

struct Scan {
    lock: Arc<File>,
    /// Checkpointed tail of each stream the checkpoint knows (0 for a removed one).
    ckpt_tails: Vec<Seq>,
    /// Per stream the checkpoint knows: it is removed there and its removal record has not
    /// been scanned yet, so its earlier records may still show up (and are skipped).
    ckpt_removed_unseen: Vec<bool>,
    epoch: Option<Epoch>,
    streams: Streams,
    report: RecoveryReport,
    /// Key records, in log order.
    keys: Vec<KeyRecord>,
}

impl Scan {
    /// A scan starting from the checkpoint's streams (live ones at their floor, removed ones
    /// as tombstones), or from nothing.
    fn new(
        ckpt: Option<&Checkpoint>,
        ckpt_path: &Path,
        lock: Arc<File>,
        report: RecoveryReport,
    ) -> Result<Scan, OpenError> {
        let mut scan = Scan {
            epoch: ckpt.map(|c| c.epoch),
            streams: Streams::default(),
            report,
            lock,
            ckpt_tails: Vec::new(),
            ckpt_removed_unseen: Vec::new(),
            keys: Vec::new(),
        };
        if let Some(c) = ckpt {
            for (i, s) in c.streams.iter().enumerate() {
                let id = StreamId(i as u32);
                let Some(s) = s else {
                    scan.streams.push_removed();
                    scan.ckpt_tails.push(0);
                    scan.ckpt_removed_unseen.push(true);
                    continue;
                };
                if scan.streams.id_of(&s.name).is_some() {
                    return Err(OpenError::Checkpoint {
                        path: ckpt_path.to_owned(),
                        reason: CheckpointError::Malformed("two live streams with one name"),
                    });
                }
                // During the scan `tail` is "last indexed": the first retained record must be
                // `floor`.
                let name: Box<str> = s.name.as_str().into();
                let st = StreamState::new(c.epoch, id, name, s.floor, s.floor - 1);
                scan.streams.push_live(st);
                scan.ckpt_tails.push(s.tail);
                scan.ckpt_removed_unseen.push(false);
            }
        }
        Ok(scan)
    }

    /// Scans one segment; returns its metadata and its write state (+ whether it is sealed).
    fn segment(
        &mut self,
        dir: &Path,
        number: u64,
        last: bool,
    ) -> Result<(SegMeta, (Active, bool)), OpenError> {
        let path = segment_path(dir, number);
        let file = File::options()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(io_err(&path))?;
        let bytes = file.metadata().map_err(io_err(&path))?.len();
        if !(SEGMENT_BYTES_MIN..=SEGMENT_BYTES_MAX).contains(&bytes) || !bytes.is_multiple_of(4096)
        {
            return Err(OpenError::BadSegmentSize { path, bytes });
        }
        let (map, mut tok) = SharedMap::map(&file, bytes as usize).map_err(io_err(&path))?;
        let (version, chain) = self.header(&map, &tok, &path, number, bytes)?;
        map.freeze(&mut tok, HEADER_BYTES);

        let mut es = Entries::new(number, last, version, bytes as usize, chain);
        self.report.segments_scanned += 1;
        self.entries(&mut es, &map, &tok, &path)?;
        if !last && !es.sealed {
            let offset =
                es.len
                    .saturating_sub(ENTRY_BYTES * (es.entries as usize + 1)) as u64;
            return Err(OpenError::Corrupt {
                path,
                offset,
                reason: CorruptReason::NotSealed,
            });
        }
        if let Some(torn) = es.torn_at {
            zero_torn_tail(&map, &mut tok, torn, es.data_end);
            map.flush().map_err(io_err(&path))?;
            self.report.torn_tail_offset = Some(torn as u64);
        }
        map.freeze(&mut tok, es.data_end);
        let seg = Arc::new(Segment::new(
            number,
            path,
            map,
            file,
            Arc::clone(&self.lock),
        ));
        Ok(es.finish(seg, bytes, tok))
    }

    /// Decodes a segment's header and checks it against the segment's number and size and
    /// the epoch of the segments before (the first one sets it); returns the format version
    /// and the header's CRC, where the entries' chain starts.
    fn header(
        &mut self,
        map: &SharedMap,
        tok: &WriteToken,
        path: &Path,
        number: u64,
        bytes: u64,
    ) -> Result<(u32, u32), OpenError> {
        let header_bytes = map.read_private(tok, 0, HEADER_BYTES);
        let header = Header::decode(header_bytes).map_err(|reason| OpenError::BadHeader {
            path: path.to_owned(),
            reason,
        })?;
        let chain = Header::crc(header_bytes);
        let mismatch = |field, expected: u64, found: u64| OpenError::HeaderMismatch {
            path: path.to_owned(),
            field,
            expected,
            found,
        };
        if header.number != number {
            return Err(mismatch("number", number, header.number));
        }
        if header.segment_bytes != bytes {
            return Err(mismatch("segment_bytes", bytes, header.segment_bytes));
        }
        match self.epoch {
            Some(e) if e != header.epoch => return Err(mismatch("epoch", e.0, header.epoch.0)),
            _ => self.epoch = Some(header.epoch),
        }
        Ok((header.version, chain))
    }

    /// Walks a segment's entries, top down, until an all-zero slot, the seal, or the records
    /// below; a bad entry is damage, except in the last segment, where it is the torn tail.
    fn entries(
        &mut self,
        es: &mut Entries,
        map: &SharedMap,
        tok: &WriteToken,
        path: &Path,
    ) -> Result<(), OpenError> {
        while let Some((slot, eb)) = es.next_entry(map, tok) {
            let corrupt = |reason| OpenError::Corrupt {
                path: path.to_owned(),
                offset: slot as u64,
                reason,
            };
            let e = match es.check(map, tok, &eb, slot) {
                Ok(e) => e,
                Err(_) if es.last => {
                    es.torn_at = Some(slot);
                    break;
                }
                Err(reason) => return Err(corrupt(reason)),
            };
            let payload_len = e.len as usize;
            self.apply(&e, es, map, tok).map_err(corrupt)?;
            if e.kind != Kind::Seal {
                es.newest_ts_ms = es.newest_ts_ms.max(e.timestamp_ms);
            }
            es.chain = Entry::crc(&eb);
            es.data_end += payload_len;
            es.entries += 1;
            self.report.bytes_scanned += (payload_len + ENTRY_BYTES) as u64;
            if es.sealed {
                break;
            }
        }
        Ok(())
    }

    /// Applies one checked entry: an event, a stream's name or removal, or the seal.
    fn apply(
        &mut self,
        e: &Entry,
        es: &mut Entries,
        map: &SharedMap,
        tok: &WriteToken,
    ) -> Result<(), CorruptReason> {
        match e.kind {
            Kind::Event => self.event(e, es.number, &mut es.seg_streams)?,
            Kind::StreamName | Kind::StreamRemoved => {
                let payload = map.read_private(tok, es.data_end, e.len as usize);
                let name = std::str::from_utf8(payload)
                    .ok()
                    .filter(|n| validate_stream_name(n).is_ok())
                    .ok_or(CorruptReason::StreamNameInvalid)?;
                if e.kind == Kind::StreamName {
                    self.stream_name(e.stream, name, e.seq)
                } else {
                    self.stream_removed(e.stream, name)
                }?;
            }
            Kind::Key => {
                let payload = map.read_private(tok, es.data_end, e.len as usize);
                self.key(e, payload)?;
            }
            Kind::Seal => {
                if e.seq != es.entries || e.len != 0 {
                    return Err(CorruptReason::BadSeal {
                        expected: es.entries,
                        found: e.seq,
                    });
                }
                es.sealed = true;
            }
        }
        Ok(())
    }

    /// A key record: kept if its stream is live and holds the events it names (written after
    /// them, so they precede it); a removed stream's is skipped.
    fn key(&mut self, e: &Entry, payload: &[u8]) -> Result<(), CorruptReason> {
        let tail = match self.streams.lookup(e.stream) {
            Lookup::Live(_) => self.streams[e.stream].tail,
            Lookup::Unknown => return Err(CorruptReason::UnknownStream(e.stream)),
            Lookup::Removed { .. } => return Ok(()),
        };
        let (count, key) = keys::decode(payload).ok_or(CorruptReason::KeyInvalid)?;
        keys::check(e.seq, count, key.len(), tail).map_err(|_| CorruptReason::KeyInvalid)?;
        self.keys.push(KeyRecord {
            stream: e.stream,
            first: e.seq,
            count,
            timestamp_ms: e.timestamp_ms,
            key: key.to_vec(),
        });
        Ok(())
    }

    /// An event: the next sequence of a live stream, or a record of a stream the checkpoint
    /// knows as removed, scanned before its removal record (skipped).
    fn event(
        &mut self,
        e: &Entry,
        number: u64,
        seg_streams: &mut Vec<StreamId>,
    ) -> Result<(), CorruptReason> {
        let st = match self.streams.lookup(e.stream) {
            Lookup::Live(_) => &mut self.streams[e.stream],
            Lookup::Unknown => return Err(CorruptReason::UnknownStream(e.stream)),
            Lookup::Removed { .. } => return self.before_checkpointed_removal(e.stream),
        };
        // Found by fuzzing (`log_forged`): a checksum-valid event with sequence u64::MAX
        // overflowed `tail + 1`; it is never a valid sequence.
        if e.seq == u64::MAX {
            return Err(CorruptReason::SequenceOverflow { stream: e.stream });
        }
        if e.seq != st.tail + 1 {
            match self.ckpt_tails.get(e.stream.0 as usize) {
                // Records up to the checkpointed tail were lost (power loss under
                // `fsync=never`, see `open`) and an earlier open continued the stream after
                // them: skip the lost range again.
                Some(&t) if st.tail < t && e.seq == t + 1 => {
                    st.index.clear();
                    st.floor = t + 1;
                    st.tail = t;
                    if !self.report.streams_behind_checkpoint.contains(&e.stream) {
                        self.report.streams_behind_checkpoint.push(e.stream);
                    }
                }
                _ => {
                    return Err(CorruptReason::SequenceGap {
                        stream: e.stream,
                        expected: st.tail + 1,
                        found: e.seq,
                    });
                }
            }
        }
        st.index.push_back(Loc {
            seg: number as u32,
            off: e.data_off,
            len: e.len,
        });
        st.tail = e.seq;
        if st.last_seg != Some(number) {
            st.last_seg = Some(number);
            seg_streams.push(e.stream);
        }
        self.report.records_recovered += 1;
        Ok(())
    }

    /// A stream name record: creates the next id, or repeats the name of a stream the
    /// checkpoint already knows.
    fn stream_name(&mut self, id: StreamId, name: &str, tail: Seq) -> Result<(), CorruptReason> {
        match self.streams.lookup(id) {
            Lookup::Live(_) if &*self.streams[id].name != name => {
                Err(CorruptReason::StreamNameMismatch(id))
            }
            Lookup::Live(_) => Ok(()),
            Lookup::Removed { .. } => self.before_checkpointed_removal(id),
            Lookup::Unknown if id.0 as usize == self.streams.ids() => {
                if self.streams.id_of(name).is_some() {
                    return Err(CorruptReason::DuplicateStreamName(id));
                }
                let epoch = self.epoch.expect("header read before entries");
                if tail >= u64::MAX - 1 {
                    return Err(CorruptReason::SequenceOverflow { stream: id });
                }
                // `tail`: what `create_stream_after` started it after (0 for most streams).
                self.streams
                    .push_live(StreamState::new(epoch, id, name.into(), tail + 1, tail));
                Ok(())
            }
            Lookup::Unknown => Err(CorruptReason::StreamIdGap {
                expected: self.streams.ids() as u32,
                found: id.0,
            }),
        }
    }

    /// A stream removed record: removes a live stream (its name must match), or is the
    /// removal record of a stream the checkpoint knows as removed.
    fn stream_removed(&mut self, id: StreamId, name: &str) -> Result<(), CorruptReason> {
        match self.streams.lookup(id) {
            Lookup::Live(_) if &*self.streams[id].name != name => {
                Err(CorruptReason::StreamNameMismatch(id))
            }
            Lookup::Live(_) => {
                self.streams.remove(id, true);
                Ok(())
            }
            Lookup::Removed { .. } => {
                self.before_checkpointed_removal(id)?;
                self.ckpt_removed_unseen[id.0 as usize] = false;
                Ok(())
            }
            Lookup::Unknown => Err(CorruptReason::UnknownStream(id)),
        }
    }

    /// A record of removed stream `id` is valid only ahead of its removal record, which only
    /// a stream removed in the checkpoint can still have to come (records are in log order;
    /// nothing of a stream follows its removal).
    fn before_checkpointed_removal(&self, id: StreamId) -> Result<(), CorruptReason> {
        if self.ckpt_removed_unseen.get(id.0 as usize) == Some(&true) {
            Ok(())
        } else {
            Err(CorruptReason::StreamRemoved(id))
        }
    }
}

/// One segment's entries as the scan walks them: the entry table grows down from the end of
/// the file, the records it describes up from the header.
struct Entries {
    number: u64,
    /// The last (active) segment: a bad entry there is its torn tail, not damage.
    last: bool,
    version: u32,
    len: usize,
    /// CRC of the last entry checked (the header's before the first).
    chain: u32,
    data_end: usize,
    entries: u64,
    sealed: bool,
    torn_at: Option<usize>,
    newest_ts_ms: u64,
    seg_streams: Vec<StreamId>,
}

impl Entries {
    fn new(number: u64, last: bool, version: u32, len: usize, chain: u32) -> Self {
        Entries {
            number,
            last,
            version,
            len,
            chain,
            data_end: HEADER_BYTES,
            entries: 0,
            sealed: false,
            torn_at: None,
            newest_ts_ms: 0,
            seg_streams: Vec::new(),
        }
    }

    /// The next entry's slot and bytes; `None` where the table would meet the records or at
    /// an all-zero slot.
    fn next_entry(&self, map: &SharedMap, tok: &WriteToken) -> Option<(usize, [u8; ENTRY_BYTES])> {
        let slot = match self
            .len
            .checked_sub(ENTRY_BYTES * (self.entries as usize + 1))
        {
            Some(s) if s >= self.data_end => s,
            _ => return None,
        };
        let eb: [u8; ENTRY_BYTES] = map
            .read_private(tok, slot, ENTRY_BYTES)
            .try_into()
            .expect("entry size");
        if eb.iter().all(|&b| b == 0) {
            return None;
        }
        Some((slot, eb))
    }

    /// Decodes the entry at `slot` and checks it: its record starts where the last one ended,
    /// ends below the entry, and its CRC chains to the previous entry's.
    fn check(
        &self,
        map: &SharedMap,
        tok: &WriteToken,
        eb: &[u8; ENTRY_BYTES],
        slot: usize,
    ) -> Result<Entry, CorruptReason> {
        let data_end = self.data_end;
        let e = Entry::decode_fields(eb, self.version).map_err(CorruptReason::Entry)?;
        if e.data_off as usize != data_end {
            return Err(CorruptReason::DataOffset {
                expected: data_end as u32,
                found: e.data_off,
            });
        }
        if data_end + e.len as usize > slot {
            return Err(CorruptReason::OutOfBounds {
                data_off: e.data_off,
                len: e.len,
            });
        }
        let payload = map.read_private(tok, data_end, e.len as usize);
        Entry::verify(eb, self.chain, payload).map_err(CorruptReason::Entry)?;
        Ok(e)
    }

    /// The scanned segment's metadata and write state (+ whether it is sealed).
    fn finish(self, seg: Arc<Segment>, bytes: u64, tok: WriteToken) -> (SegMeta, (Active, bool)) {
        let meta = SegMeta {
            seg,
            bytes,
            newest_ts_ms: self.newest_ts_ms,
            streams: self.seg_streams,
        };
        let entry_low = self.len - ENTRY_BYTES * self.entries as usize;
        let active = Active {
            tok,
            data_end: self.data_end,
            entry_low,
            entries: self.entries,
            sealed: self.sealed,
            version: self.version,
            chain: self.chain,
            populated_high: self.data_end,
            populated_low: entry_low,
            header: HeaderState::Durable,
            prepare_below: self.len / 2,
        };
        (meta, (active, self.sealed))
    }
}

/// Zeroes the torn entry at `torn` and any run of non-zero slots right below it, so the next
/// open sees a clean end there. (Stale entries further down can never validate: the CRC
/// chain ties each entry to its predecessor.)
fn zero_torn_tail(map: &SharedMap, tok: &mut WriteToken, torn: usize, data_end: usize) {
    let mut slot = torn;
    loop {
        let bytes = map.private_mut(tok, slot, ENTRY_BYTES);
        if bytes.iter().all(|&b| b == 0) {
            break;
        }
        bytes.fill(0);
        match slot.checked_sub(ENTRY_BYTES) {
            Some(s) if s >= data_end => slot = s,
            _ => break,
        }
    }
}
