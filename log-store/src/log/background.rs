//! The log's background thread (`log-prepare`), started once per process by
//! [`prepare_in_background`]. For every `Log` opened afterwards it
//! - prepares the next segment file while the active one fills (past half): creates or adopts
//!   the file, preallocates it, makes it and its directory entry durable, maps it and faults
//!   its pages in, so the roll only adopts it (no syscall);
//! - writes retention's checkpoint (tmp file, `fsync`, `rename`, `fsync(dir)`) and only then
//!   deletes (or keeps as the spare) the segments it retires;
//! - faults the active segment's pages in ahead of the writer (`MADV_POPULATE_WRITE`).
//!
//! The thread owns the log's spare file in this mode: only its jobs rename a retired segment to
//! `spare` or adopt it, in queue order, so a checkpoint job's spare serves the next
//! preparation. A roll whose prepared segment is not ready creates it inline (counted by
//! [`Log::inline_segment_creations`]); so does one whose preparation failed (an I/O error, a
//! full disk, a panic: counted by [`Log::prepare_failures`]). A panicking job does not end the
//! thread. Nothing here is needed for correctness after a crash:
//! an unadopted prepared file has a zero header (deleted at open) and a checkpoint not yet
//! written leaves every segment in place (DESIGN.md, C16-C18).
#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};

use super::retention::{Retiring, retire_segment, write_checkpoint};
use super::segfile::{self, SegFile};
use super::*;

static THREAD: OnceLock<Sender<Job>> = OnceLock::new();

/// From now on, every [`Log`] opened in this process prepares its next segment and writes its
/// retention checkpoints on one background thread (`log-prepare`) instead of the caller's
/// thread. Logs opened before keep working inline. Idempotent. Fails only if the thread cannot
/// be spawned (then logs keep working inline).
pub fn prepare_in_background() -> io::Result<()> {
    if THREAD.get().is_some() {
        return Ok(());
    }
    let (tx, rx) = channel::<Job>();
    std::thread::Builder::new()
        .name("log-prepare".into())
        .spawn(move || {
            for job in rx {
                // A panicking job must not end the thread, or every later job of every log
                // would run nowhere; a preparation's slot is settled by its own guard
                // (`PrepareGuard`). The panic hook has reported the panic already.
                let _ = catch_unwind(AssertUnwindSafe(|| job.run()));
                // Jobs run back to back when several logs asked at once: a reactor sharing
                // this CPU gets it back between them (see `pretouch`).
                std::thread::yield_now();
            }
        })?;
    // A racing second caller's thread ends at once: its sender is dropped with it.
    let _ = THREAD.set(tx);
    Ok(())
}

/// Where a log's jobs run.
#[derive(Debug, Clone)]
pub(crate) enum Executor {
    /// The process's `log-prepare` thread.
    Thread(Sender<Job>),
    /// A queue the owner runs by hand ([`Log::run_background_jobs`]): tests stop at any point.
    Manual(Arc<Mutex<VecDeque<Job>>>),
}

impl Executor {
    /// The background thread, if [`prepare_in_background`] started it.
    pub(crate) fn started() -> Option<Executor> {
        THREAD.get().cloned().map(Executor::Thread)
    }

    pub(crate) fn manual() -> Executor {
        Executor::Manual(Arc::default())
    }

    fn submit(&self, job: Job) {
        match self {
            Executor::Thread(tx) => {
                if let Err(e) = tx.send(job) {
                    e.0.run(); // the thread is gone: run it here
                }
            }
            Executor::Manual(q) => lock(q).push_back(job),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One unit of background work.
#[derive(Debug)]
pub(crate) enum Job {
    Prepare(PrepareJob),
    Checkpoint(CheckpointJob),
    /// Fault `len` bytes at `off` of the active segment in, writable, ahead of the writer.
    Populate {
        seg: Arc<Segment>,
        off: usize,
        len: usize,
    },
}

impl Job {
    fn run(self) {
        match self {
            Job::Prepare(j) => j.run(),
            Job::Checkpoint(j) => j.run(),
            Job::Populate { seg, off, len } => seg.map().populate(off, len),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Preparing the next segment
// ---------------------------------------------------------------------------------------------

/// A prepared segment file waiting for its roll. Dropped unadopted (the log went away), it is
/// unmapped and its file — blank, zero header — unlinked, through the retire path.
#[derive(Debug)]
pub(crate) struct Prepared {
    file: Option<SegFile>,
    lock: Arc<File>,
}

impl Prepared {
    pub(crate) fn into_file(mut self) -> SegFile {
        self.file.take().expect("taken once")
    }
}

impl Drop for Prepared {
    fn drop(&mut self) {
        if let Some(f) = self.file.take() {
            retire::retire(retire::Retired {
                _map: f.map,
                _file: f.file,
                unlink: Some(f.path),
                _lock: Arc::clone(&self.lock),
            });
        }
    }
}

#[derive(Debug)]
enum PrepState {
    Queued,
    Running,
    Done(Result<Prepared, AppendError>),
    /// The roll came first and created the segment itself: the job does nothing.
    Cancelled,
    Taken,
}

/// The meeting point of one preparation and the roll that adopts it.
#[derive(Debug)]
pub(crate) struct PrepSlot {
    number: u64,
    /// Requested after the roll's own attempt failed (disk full): a roll finding it still
    /// queued leaves it be (it may adopt the spare, which the roll may not) and reports the
    /// failure again instead of creating the file itself.
    after_failure: bool,
    state: Mutex<PrepState>,
    done: Condvar,
}

impl PrepSlot {
    fn cancel_if_queued(&self) {
        let mut st = lock(&self.state);
        if matches!(*st, PrepState::Queued) {
            *st = PrepState::Cancelled;
        }
    }
}

#[derive(Debug)]
pub(crate) struct PrepareJob {
    slot: Arc<PrepSlot>,
    dir: PathBuf,
    bytes: u64,
    durable: bool,
    spare: Arc<AtomicBool>,
    lock: Arc<File>,
    /// The log's count of failed preparations ([`Log::prepare_failures`]).
    failures: Arc<AtomicU64>,
    /// Panic once started (test hook [`Log::panic_next_preparation`]).
    panic: bool,
}

/// Settles a preparation that unwinds (a panic in the job): its slot, still `Running`,
/// becomes `Done(Err(..))` and its waiters are woken, so the roll waiting in
/// [`Background::take_prepared`] creates the segment inline instead of waiting forever; the
/// failure is counted. A preparation that returns settles its slot itself first.
struct PrepareGuard<'a> {
    slot: &'a PrepSlot,
    failures: &'a AtomicU64,
}

impl Drop for PrepareGuard<'_> {
    fn drop(&mut self) {
        let mut st = lock(&self.slot.state);
        if matches!(*st, PrepState::Running) {
            let e = io::Error::other("segment preparation panicked");
            *st = PrepState::Done(Err(AppendError::Io(e)));
            self.failures.fetch_add(1, Ordering::Relaxed);
            drop(st);
            self.slot.done.notify_all();
        }
    }
}

/// Pages faulted in by a preparation, at most (a larger segment gets its first and last
/// parts; the writer's own populate-ahead covers the rest).
const PRETOUCH_BYTES_MAX: usize = 64 << 20;

impl PrepareJob {
    fn run(self) {
        {
            let mut st = lock(&self.slot.state);
            if !matches!(*st, PrepState::Queued) {
                return;
            }
            *st = PrepState::Running;
        }
        let _guard = PrepareGuard {
            slot: &self.slot,
            failures: &self.failures,
        };
        assert!(!self.panic, "segment preparation panicked (test hook)");
        let spare = self.spare.swap(false, Ordering::AcqRel);
        let r = segfile::create_file(
            &self.dir,
            self.slot.number,
            self.bytes,
            spare,
            self.durable,
            true,
        )
        .map(|f| {
            // Owned by a `Prepared` first: a panic below unlinks the file (its `Drop`).
            let mut p = Prepared {
                file: Some(f),
                lock: Arc::clone(&self.lock),
            };
            pretouch(p.file.as_mut().expect("just made"), self.bytes as usize);
            p
        });
        if r.is_err() {
            // The roll creates the segment inline instead (the error is its to report again).
            self.failures.fetch_add(1, Ordering::Relaxed);
        }
        *lock(&self.slot.state) = PrepState::Done(r);
        self.slot.done.notify_all();
    }
}

/// Faults a prepared segment's pages in (`len` bytes; see [`PRETOUCH_BYTES_MAX`]), and the
/// writer's first chunk at both ends writable, as its first append would.
fn pretouch(f: &mut SegFile, len: usize) {
    if len <= PRETOUCH_BYTES_MAX {
        populate_read_yielding(f, 0, len);
    } else {
        let top = PRETOUCH_BYTES_MAX / 8;
        populate_read_yielding(f, 0, PRETOUCH_BYTES_MAX - top);
        populate_read_yielding(f, len - top, top);
    }
    f.map.populate(HEADER_BYTES, POPULATE_AHEAD_BYTES);
    f.map.populate(
        len.saturating_sub(POPULATE_AHEAD_BYTES),
        POPULATE_AHEAD_BYTES,
    );
    f.populated = true;
}

/// [`populate_read`](crate::mmap::SharedMap::populate_read) a piece at a time, yielding the
/// CPU between pieces. One call for a whole 16 MiB segment is milliseconds of kernel time,
/// which a reactor on the same CPU waited out: the kernel (without preemption, as here) and
/// the scheduler do not always hand the CPU back when the reactor becomes runnable
/// (BENCHMARKS.md, "Session 18").
fn populate_read_yielding(f: &SegFile, off: usize, len: usize) {
    for (i, (at, n)) in pieces(off, len, POPULATE_PIECE_BYTES).enumerate() {
        if i > 0 {
            std::thread::yield_now();
        }
        f.map.populate_read(at, n);
    }
}

/// What [`populate_read_yielding`] faults in per call.
const POPULATE_PIECE_BYTES: usize = 1 << 20;

/// `[off, off + len)` as consecutive `(offset, length)` pieces of at most `piece` bytes.
fn pieces(off: usize, len: usize, piece: usize) -> impl Iterator<Item = (usize, usize)> {
    let end = off + len;
    (off..end)
        .step_by(piece.max(1))
        .map(move |at| (at, piece.min(end - at)))
}

/// What the roll found of the preparation of its segment.
pub(crate) enum Take {
    /// Prepared in time: adopt it.
    Ready(Prepared),
    /// Prepared, but the roll had to wait for it.
    Waited(Prepared),
    /// Not prepared (not requested, not started, or failed): create it inline.
    NotReady,
    /// Requested after a failed inline attempt and not run yet: fail again (disk full).
    Pending,
}

// ---------------------------------------------------------------------------------------------
// Retention's checkpoint, then the deletions it allows
// ---------------------------------------------------------------------------------------------

/// A failed checkpoint hands its segments back: the next retention pass retries.
type CheckpointDone = Result<(), (RetentionError, Vec<Retiring>)>;

#[derive(Debug)]
pub(crate) struct CheckpointJob {
    dir: PathBuf,
    ckpt: Checkpoint,
    segs: Vec<Retiring>,
    segment_bytes: u64,
    spare: Arc<AtomicBool>,
    done: Sender<CheckpointDone>,
    /// The directory stays locked until the job is done, even if the log is dropped first.
    _lock: Arc<File>,
}

impl CheckpointJob {
    fn run(self) {
        let outcome = match write_checkpoint(&self.dir, &self.ckpt) {
            Ok(()) => {
                let mut spare = self.spare.load(Ordering::Acquire);
                for r in self.segs {
                    retire_segment(&self.dir, r.seg, r.bytes, self.segment_bytes, &mut spare);
                }
                self.spare.store(spare, Ordering::Release);
                Ok(())
            }
            // Nothing deleted: every segment stays on disk, covered by the old checkpoint.
            Err(e) => Err((e, self.segs)),
        };
        // The log may be gone: then the segments drop here, files kept (the next open's
        // checkpoint is the old one, which still counts them).
        let _ = self.done.send(outcome);
    }
}

// ---------------------------------------------------------------------------------------------
// Per log
// ---------------------------------------------------------------------------------------------

impl Log {
    /// Test hook: drops the log as a crash would leave it (a deferred header stays unwritten).
    #[doc(hidden)]
    pub fn simulate_crash(mut self) {
        self.abandon = true;
    }

    /// Test hook: runs this log's queued background jobs (manual mode, see
    /// [`Log::open_with_manual_background`]) on the calling thread; returns how many ran.
    #[doc(hidden)]
    pub fn run_background_jobs(&mut self) -> usize {
        self.bg
            .as_mut()
            .map_or(0, background::Background::run_queued)
    }

    /// Test hook: whether the next segment's preparation was requested and not yet adopted.
    #[doc(hidden)]
    pub fn next_segment_requested(&self) -> bool {
        self.bg
            .as_ref()
            .is_some_and(background::Background::prepare_requested)
    }

    /// Blocks until this log's background jobs (preparation, checkpoints) have finished.
    #[doc(hidden)]
    pub fn wait_background(&mut self) {
        if let Some(bg) = &mut self.bg {
            bg.wait_idle();
        }
    }

    /// Rolls that did segment work on the caller's thread: created the next segment file inline
    /// (every roll without background preparation; with it, a roll whose prepared segment was
    /// not ready, e.g. in a burst) or waited for its preparation. For a gauge of stalls.
    pub fn inline_segment_creations(&self) -> u64 {
        self.rolls.inline
    }

    /// How the log's rolls went: prepared, inline, flushed first; failed preparations.
    pub fn roll_counts(&self) -> RollCounts {
        RollCounts {
            prepare_failures: self.prepare_failures(),
            ..self.rolls
        }
    }

    /// Background preparations of the next segment that failed (an I/O error such as a failed
    /// `fdatasync` of the file or `fsync` of the directory, a full disk, a panic): the roll
    /// then created the segment on the caller's thread, as when the preparation is not ready,
    /// and reports any error itself. For a counter: a rising one means the disk is failing
    /// under the background thread. Always 0 without background preparation.
    pub fn prepare_failures(&self) -> u64 {
        self.bg
            .as_ref()
            .map_or(0, |bg| bg.prepare_failures.load(Ordering::Relaxed))
    }

    /// Test hook: the next preparation requested panics once started on the background thread
    /// (or in [`Log::run_background_jobs`]), to check that the roll does not wait for it forever
    /// and that the thread survives.
    #[doc(hidden)]
    pub fn panic_next_preparation(&mut self) {
        if let Some(bg) = &mut self.bg {
            bg.panic_next = true;
        }
    }
}

/// A log's side of the background work.
#[derive(Debug)]
pub(crate) struct Background {
    exec: Executor,
    /// A retired segment's file (`SPARE_FILE`) waits for the next preparation. Only jobs touch
    /// it (in queue order).
    spare: Arc<AtomicBool>,
    prep: Option<Arc<PrepSlot>>,
    done_tx: Sender<CheckpointDone>,
    done_rx: Receiver<CheckpointDone>,
    checkpoints_in_flight: usize,
    failed: Option<(RetentionError, Vec<Retiring>)>,
    /// Failed preparations, counted by their jobs ([`Log::prepare_failures`]).
    prepare_failures: Arc<AtomicU64>,
    /// The next preparation panics (test hook [`Log::panic_next_preparation`]).
    panic_next: bool,
}

impl Background {
    pub(crate) fn new(exec: Executor) -> Background {
        let (done_tx, done_rx) = channel();
        Background {
            exec,
            spare: Arc::default(),
            prep: None,
            done_tx,
            done_rx,
            checkpoints_in_flight: 0,
            failed: None,
            prepare_failures: Arc::default(),
            panic_next: false,
        }
    }

    /// Queues the preparation of segment `number` (replacing an older request);
    /// `after_failure`: see [`PrepSlot::after_failure`].
    pub(crate) fn request_prepare(
        &mut self,
        dir: &Path,
        (number, bytes, durable): (u64, u64, bool),
        after_failure: bool,
        lock: &Arc<File>,
    ) {
        if let Some(old) = self.prep.take() {
            old.cancel_if_queued();
        }
        let slot = Arc::new(PrepSlot {
            number,
            after_failure,
            state: Mutex::new(PrepState::Queued),
            done: Condvar::new(),
        });
        self.prep = Some(Arc::clone(&slot));
        self.exec.submit(Job::Prepare(PrepareJob {
            slot,
            dir: dir.to_owned(),
            bytes,
            durable,
            spare: Arc::clone(&self.spare),
            lock: Arc::clone(lock),
            failures: Arc::clone(&self.prepare_failures),
            panic: std::mem::take(&mut self.panic_next),
        }));
    }

    /// The prepared segment `number`, if its preparation is done (waiting for it if it is
    /// running; cancelling it if it has not started).
    pub(crate) fn take_prepared(&mut self, number: u64) -> Take {
        let Some(slot) = self.prep.take() else {
            return Take::NotReady;
        };
        if slot.number != number {
            slot.cancel_if_queued();
            return Take::NotReady;
        }
        let mut st = lock(&slot.state);
        let mut waited = false;
        while matches!(*st, PrepState::Running) {
            waited = true;
            st = slot.done.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        match std::mem::replace(&mut *st, PrepState::Taken) {
            PrepState::Done(Ok(p)) if waited => Take::Waited(p),
            PrepState::Done(Ok(p)) => Take::Ready(p),
            PrepState::Queued if slot.after_failure => {
                *st = PrepState::Queued;
                drop(st);
                self.prep = Some(slot);
                Take::Pending
            }
            PrepState::Queued => {
                *st = PrepState::Cancelled;
                Take::NotReady
            }
            // A failed preparation (e.g. ENOSPC): the inline attempt reports the error.
            _ => Take::NotReady,
        }
    }

    /// Has `len` bytes at `off` of `seg` faulted in writable (see [`Job::Populate`]).
    pub(crate) fn populate(&self, seg: &Arc<Segment>, off: usize, len: usize) {
        self.exec.submit(Job::Populate {
            seg: Arc::clone(seg),
            off,
            len,
        });
    }

    pub(crate) fn prepare_requested(&self) -> bool {
        self.prep.is_some()
    }

    /// Queues "write `ckpt`, then delete `segs`" (see [`CheckpointJob`]).
    pub(crate) fn submit_checkpoint(
        &mut self,
        dir: &Path,
        ckpt: Checkpoint,
        segs: Vec<Retiring>,
        segment_bytes: u64,
        lock: &Arc<File>,
    ) {
        self.checkpoints_in_flight += 1;
        self.exec.submit(Job::Checkpoint(CheckpointJob {
            dir: dir.to_owned(),
            ckpt,
            segs,
            segment_bytes,
            spare: Arc::clone(&self.spare),
            done: self.done_tx.clone(),
            _lock: Arc::clone(lock),
        }));
    }

    /// Collects finished checkpoint jobs; `block`: until none is in flight.
    fn collect(&mut self, block: bool) {
        while self.checkpoints_in_flight > 0 {
            let done = if block {
                match self.done_rx.recv() {
                    Ok(d) => d,
                    Err(_) => break,
                }
            } else {
                match self.done_rx.try_recv() {
                    Ok(d) => d,
                    Err(_) => break,
                }
            };
            self.checkpoints_in_flight -= 1;
            if let Err((e, segs)) = done {
                match &mut self.failed {
                    Some((last, all)) => {
                        *last = e;
                        all.extend(segs);
                    }
                    None => self.failed = Some((e, segs)),
                }
            }
        }
    }

    /// The latest checkpoint failure since the last call, with every segment it left in place.
    pub(crate) fn take_failed(&mut self) -> Option<(RetentionError, Vec<Retiring>)> {
        self.collect(false);
        self.failed.take()
    }

    /// Runs the jobs queued by hand (manual executor only); returns how many ran.
    pub(crate) fn run_queued(&mut self) -> usize {
        let Executor::Manual(q) = &self.exec else {
            return 0;
        };
        let mut n = 0;
        while let Some(job) = lock(q).pop_front() {
            job.run();
            n += 1;
        }
        n
    }

    /// Until every job of this log has finished (manual executor: runs them).
    pub(crate) fn wait_idle(&mut self) {
        self.run_queued();
        if let Some(slot) = &self.prep {
            let mut st = lock(&slot.state);
            while matches!(*st, PrepState::Queued | PrepState::Running) {
                st = slot.done.wait(st).unwrap_or_else(|e| e.into_inner());
            }
        }
        self.collect(true);
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Some(slot) = self.prep.take() {
            slot.cancel_if_queued();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::pieces;

    #[test]
    fn pieces_cover_the_range_once_in_order() {
        for (off, len, piece) in [(0, 0, 4), (0, 10, 4), (3, 8, 4), (5, 4, 4), (7, 1, 1 << 20)] {
            let got: Vec<_> = pieces(off, len, piece).collect();
            let mut at = off;
            for &(o, n) in &got {
                assert_eq!(o, at, "{off} {len} {piece}: {got:?}");
                assert!(n > 0 && n <= piece, "{off} {len} {piece}: {got:?}");
                at += n;
            }
            assert_eq!(at, off + len, "{off} {len} {piece}: {got:?}");
        }
        assert_eq!(pieces(3, 8, 4).collect::<Vec<_>>(), [(3, 4), (7, 4)]);
        assert_eq!(
            pieces(0, 10, 4).collect::<Vec<_>>(),
            [(0, 4), (4, 4), (8, 2)]
        );
    }
}
