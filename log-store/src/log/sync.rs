//! The group commit: which files a sync covers and which tails it makes visible
//! (`begin_sync`/`finish_sync`, or `sync_now`), and — in background mode — how the active
//! segment's deferred header moves along with the commits (DESIGN.md "Segment roll").
#![forbid(unsafe_code)]

use super::*;

/// The group commit in flight: from which segment it flushes, and each stream's tail when it
/// began (what it makes visible).
#[derive(Debug)]
pub(super) struct Syncing {
    pub(super) from_segment: u64,
    pub(super) marks: Vec<(StreamId, Seq)>,
    /// Removals written before it began (durable when it completes).
    pub(super) removals: Vec<StreamId>,
    /// The active segment and its header's stage when it began, if not durable then.
    pub(super) header: Option<(u64, HeaderStage)>,
}

/// [`HeaderState`] as a group commit saw it when it began.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum HeaderStage {
    Waiting,
    Written,
}

/// Marks and removals of completed syncs, held back until the active segment's header is
/// durable (they may cover records in it); and what a sync the log ran on its own made
/// visible, held back until the caller's next report.
#[derive(Debug, Default)]
pub(super) struct Held {
    pub(super) marks: Vec<(StreamId, Seq)>,
    pub(super) removals: Vec<StreamId>,
    /// The report of the syncs the log ran on its own ([`Log::sync_unreported`]: a roll's
    /// forced sync, inline retention's), merged into the next report the caller gets
    /// (`finish_sync`, `sync_now`, `poll_sync`). Its caller wakes subscribers from reports,
    /// and no later sync names these streams again (their visible tail moved already).
    pub(super) unreported: SyncReport,
}

impl Drop for Log {
    /// A deferred header (background mode) is written on the way out, after the segments
    /// before it are flushed, so a clean drop keeps everything appended, as without
    /// background preparation (a process crash instead drops the records behind it, which
    /// were never visible: DESIGN.md C17).
    fn drop(&mut self) {
        // Segments and preparations may outlive this log for a moment: an open of the same
        // directory in this process waits for them instead of failing with `Locked`.
        super::recover::releasing(&self.lock);
        if self.poisoned || self.abandon || !matches!(self.active.header, HeaderState::Waiting(_)) {
            return;
        }
        let active = self.active_segment();
        let in_flight = self.syncing.as_ref().map(|s| s.from_segment);
        let from = [self.unflushed_from, in_flight].into_iter().flatten().min();
        let from = from.unwrap_or(active);
        let flushed = self
            .segs
            .iter()
            .filter(|m| (from..active).contains(&m.seg.number))
            .all(|m| m.seg.map().flush().is_ok());
        if flushed {
            self.write_pending_header();
        }
    }
}

impl Log {
    /// Whether a group commit should start now: records are unsynced, no sync is in flight,
    /// the log is not poisoned, and the policy says so (`group`, `always`: at once;
    /// `interval:<ms>`: once the oldest unsynced record is that old; `never`: never).
    pub fn sync_due(&self, now: Instant) -> bool {
        if self.syncing.is_some() || self.poisoned {
            return false;
        }
        match self.opts.fsync {
            // At once, whatever `now` is: a reactor's clock is read at the start of its turn,
            // before the turn's appends, and comparing it with their time would leave the
            // commit for a later turn (a timer wake per commit; measured 50-120 µs each).
            FsyncPolicy::Always | FsyncPolicy::Group => self.unsynced_since.is_some(),
            _ => self.next_sync_deadline().is_some_and(|d| now >= d),
        }
    }

    /// Whether a group commit begun by [`Log::begin_sync`] has not been finished yet.
    pub fn sync_in_flight(&self) -> bool {
        self.syncing.is_some()
    }

    /// Starts a group commit of every record appended so far, for the caller to carry out
    /// asynchronously: `fdatasync` each of the job's files, then [`Log::finish_sync`]. Records
    /// appended meanwhile are left for the next one. `None` when nothing is unsynced, a sync is
    /// already in flight, or the log is poisoned.
    ///
    /// Why a sync of the file covers writes made through the mapping: the mapping is
    /// `MAP_SHARED`, so its pages are the file's page-cache pages; `fdatasync(2)` writes back
    /// the file's dirty pages however they were dirtied (on Linux `msync(MS_ASYNC)` is a no-op
    /// because "the kernel properly tracks dirty pages", msync(2)) and waits for the device.
    pub fn begin_sync(&mut self) -> Option<SyncJob> {
        if self.syncing.is_some() || self.poisoned {
            return None;
        }
        let from = self.unflushed_from?;
        let segs = self
            .segs
            .iter()
            .filter(|m| m.seg.number >= from)
            .map(|m| Arc::clone(&m.seg))
            .collect();
        let marks = self.take_dirty_marks();
        let removals = std::mem::take(&mut self.unsynced_removals);
        self.unflushed_from = None;
        self.unsynced_since = None;
        let header = match self.active.header {
            HeaderState::Durable => None,
            HeaderState::Waiting(_) => Some((self.active_segment(), HeaderStage::Waiting)),
            HeaderState::Written => Some((self.active_segment(), HeaderStage::Written)),
        };
        self.syncing = Some(Syncing {
            from_segment: from,
            marks,
            removals,
            header,
        });
        Some(SyncJob { segs })
    }

    /// Ends the group commit in flight with the outcome of its `fdatasync`s: on success the
    /// streams it covered become visible up to where they were when it began, and the
    /// removals written before it began are durable (`SyncReport::removed`); the report also
    /// names what a sync the log ran on its own made visible or durable since the caller's
    /// last report (a roll's forced sync, inline retention). A failure poisons the log for
    /// good (never retried: after a failed fsync the kernel may have dropped the dirty pages,
    /// so a later success would claim durability for lost data).
    pub fn finish_sync(
        &mut self,
        job: SyncJob,
        outcome: io::Result<()>,
    ) -> Result<SyncReport, SyncError> {
        drop(job);
        let s = self
            .syncing
            .take()
            .expect("finish_sync without a sync in flight");
        if let Err(e) = outcome {
            self.poisoned = true;
            return Err(SyncError::Io(e));
        }
        if self.poisoned {
            return Err(SyncError::Poisoned);
        }
        let (marks, removals) = if self.settle_header(s.header) {
            self.release_held(s.marks, s.removals)
        } else {
            self.held.marks.extend(s.marks);
            self.held.removals.extend(s.removals);
            (Vec::new(), Vec::new())
        };
        let mut report = self.make_visible(&marks);
        self.removals_durable(removals, &mut report);
        Ok(self.with_unreported(report))
    }

    /// Moves the active segment's header on after a successful sync that began with the header
    /// at `began` (`None`: durable then). Returns whether that sync's marks may be made
    /// visible: it began before the roll (so covers nothing of this segment), or the header is
    /// durable now.
    fn settle_header(&mut self, began: Option<(u64, HeaderStage)>) -> bool {
        let Some((number, stage)) = began else {
            return true;
        };
        if number != self.active_segment() {
            // Rolled since; that roll flushed everything first (`roll`), this sync's marks
            // included.
            return true;
        }
        match (stage, &self.active.header) {
            // It covered the previous segment's seal: the header may go in now, and the next
            // sync makes it durable.
            (HeaderStage::Waiting, HeaderState::Waiting(_)) => {
                self.write_pending_header();
                false
            }
            (HeaderStage::Written, HeaderState::Written) => {
                self.active.header = HeaderState::Durable;
                true
            }
            (_, HeaderState::Durable) => true,
            _ => false,
        }
    }

    /// Writes the active segment's deferred header into its mapping (the previous segment's
    /// seal is durable), freezes what was appended meanwhile, and asks for a sync.
    fn write_pending_header(&mut self) {
        let HeaderState::Waiting(header) =
            std::mem::replace(&mut self.active.header, HeaderState::Written)
        else {
            return;
        };
        let meta = self.segs.back().expect("active segment");
        let map = meta.seg.map();
        let a = &mut self.active;
        map.private_mut(&mut a.tok, 0, HEADER_BYTES)
            .copy_from_slice(&header);
        map.freeze(&mut a.tok, a.data_end);
        let n = meta.seg.number;
        self.unflushed_from = Some(self.unflushed_from.map_or(n, |u| u.min(n)));
        self.unsynced_since.get_or_insert_with(Instant::now);
    }

    /// Adds the held marks and removals to `marks`/`removals` once the active header is
    /// durable (one mark per stream, the highest). While it is not, `marks` come from a sync
    /// that began before the roll, and the held ones keep waiting.
    fn release_held(
        &mut self,
        mut marks: Vec<(StreamId, Seq)>,
        mut removals: Vec<StreamId>,
    ) -> (Vec<(StreamId, Seq)>, Vec<StreamId>) {
        if !matches!(self.active.header, HeaderState::Durable) {
            return (marks, removals);
        }
        if !self.held.marks.is_empty() {
            marks.append(&mut self.held.marks);
            marks.sort_unstable_by_key(|&(id, seq)| (id.0, std::cmp::Reverse(seq)));
            marks.dedup_by_key(|(id, _)| *id);
        }
        removals.append(&mut self.held.removals);
        (marks, removals)
    }

    /// The dirty streams and their tails, now clean (appends re-dirty them). Streams removed
    /// meanwhile are dropped: their appends are durable with their removal.
    fn take_dirty_marks(&mut self) -> Vec<(StreamId, Seq)> {
        let streams = &mut self.streams;
        self.dirty
            .drain(..)
            .filter_map(|id| {
                let st = streams.get_mut(id)?;
                st.dirty = false;
                Some((id, st.tail))
            })
            .collect()
    }

    /// Raises each live stream's visible tail to its mark; reports those that moved.
    fn make_visible(&mut self, marks: &[(StreamId, Seq)]) -> SyncReport {
        let mut report = SyncReport {
            advanced: Vec::with_capacity(marks.len()),
            removed: Vec::new(),
        };
        for &(id, mark) in marks {
            let Some(st) = self.streams.get_mut(id) else {
                continue; // removed while the sync ran
            };
            if mark > st.visible {
                st.visible = mark;
                report.advanced.push((id, mark));
            }
        }
        report
    }

    /// Marks `removals` durable and reports them.
    fn removals_durable(&mut self, removals: Vec<StreamId>, report: &mut SyncReport) {
        for &id in &removals {
            self.streams.mark_removal_durable(id);
        }
        report.removed = removals;
    }

    /// Group commit: performs the fsync the policy requires now (`Always`: if anything is
    /// unsynced; `Interval`: if the oldest unsynced write is `interval_ms` old; `Never`:
    /// nothing) and reports the streams whose visible tail advanced — also those a sync the
    /// log ran on its own made visible since the last report (inline retention's), even when
    /// nothing is due.
    pub fn poll_sync(&mut self, now: Instant) -> Result<SyncReport, SyncError> {
        match self.next_sync_deadline() {
            Some(deadline) if now >= deadline => self.sync_now(),
            _ => Ok(self.with_unreported(SyncReport::default())),
        }
    }

    /// Flushes everything written so far (any policy) and makes it visible.
    /// With a group commit in flight, this flushes what it covers too and makes its streams
    /// visible (its own `finish_sync` then changes nothing more). Like `finish_sync`, it also
    /// reports what the log's own syncs made visible since the caller's last report.
    pub fn sync_now(&mut self) -> Result<SyncReport, SyncError> {
        if self.poisoned {
            return Err(SyncError::Poisoned);
        }
        let in_flight = self.syncing.as_ref().map(|s| s.from_segment);
        let pending = !matches!(self.active.header, HeaderState::Durable);
        let from = [self.unflushed_from, in_flight].into_iter().flatten().min();
        if let Some(from) = from.or(pending.then(|| self.active_segment())) {
            self.flush_from(from)?;
            self.unflushed_from = None;
        }
        self.unsynced_since = None;
        let mut marks = self.take_dirty_marks();
        let mut removals = std::mem::take(&mut self.unsynced_removals);
        if let Some(s) = &mut self.syncing {
            marks.extend_from_slice(&s.marks);
            // Reported here, not again by the in-flight sync's `finish_sync`.
            removals.append(&mut s.removals);
        }
        let (marks, removals) = self.release_held(marks, removals);
        let mut report = self.make_visible(&marks);
        self.removals_durable(removals, &mut report);
        Ok(self.with_unreported(report))
    }

    /// [`Log::sync_now`] for the log's own needs (a roll whose segment filled before its
    /// header was durable, inline retention): what it makes visible and durable is not lost
    /// but kept for the caller's next report ([`Held::unreported`]).
    pub(super) fn sync_unreported(&mut self) -> Result<(), SyncError> {
        // `sync_now` merged the earlier unreported ones in.
        self.held.unreported = self.sync_now()?;
        Ok(())
    }

    /// `report` with the unreported syncs' outcome merged in ([`Held::unreported`]): one
    /// `advanced` entry per stream, the highest, none for a stream removed since (as for any
    /// report); the removals of both.
    fn with_unreported(&mut self, mut report: SyncReport) -> SyncReport {
        let kept = std::mem::take(&mut self.held.unreported);
        if kept.advanced.is_empty() && kept.removed.is_empty() {
            return report;
        }
        let streams = &self.streams;
        let live = kept
            .advanced
            .into_iter()
            .filter(|&(id, _)| streams.get(id).is_some());
        report.advanced.extend(live);
        report
            .advanced
            .sort_unstable_by_key(|&(id, seq)| (id.0, std::cmp::Reverse(seq)));
        report.advanced.dedup_by_key(|(id, _)| *id);
        let mut removed = kept.removed;
        removed.append(&mut report.removed);
        report.removed = removed;
        report
    }

    /// Flushes (`msync`) every segment numbered `from` or more; a deferred header of the
    /// active segment is written only once the segments before it are flushed. A failure
    /// poisons the log. Afterwards the active header is durable.
    fn flush_from(&mut self, from: u64) -> Result<(), SyncError> {
        let active = self.active_segment();
        let waiting = matches!(self.active.header, HeaderState::Waiting(_));
        let mut flushed = Ok(());
        for m in self.segs.iter().filter(|m| m.seg.number >= from) {
            if waiting && m.seg.number == active {
                continue;
            }
            flushed = flushed.and_then(|()| m.seg.map().flush());
        }
        if waiting && flushed.is_ok() {
            self.write_pending_header();
            flushed = self.segs.back().expect("active").seg.map().flush();
        }
        if let Err(e) = flushed {
            self.poisoned = true;
            return Err(SyncError::Io(e));
        }
        self.active.header = HeaderState::Durable;
        Ok(())
    }

    /// When `poll_sync` next has work (for reactor timers); `None` when it has none: nothing
    /// unsynced, a sync in flight (its completion is the next event), or a poisoned log (no
    /// sync starts again).
    pub fn next_sync_deadline(&self) -> Option<Instant> {
        if self.syncing.is_some() || self.poisoned {
            return None;
        }
        let since = self.unsynced_since?;
        match self.opts.fsync {
            FsyncPolicy::Never => None,
            FsyncPolicy::Always | FsyncPolicy::Group => Some(since),
            FsyncPolicy::Interval { interval_ms } => {
                Some(since + Duration::from_millis(interval_ms))
            }
        }
    }
}
