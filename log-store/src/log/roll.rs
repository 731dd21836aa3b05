//! The segment roll: sealing the active segment and starting the next one, inline or by
//! adopting the segment the background thread prepared (DESIGN.md "Segment roll").
#![forbid(unsafe_code)]

use super::keys::KEY_RECORD_BYTES_MAX;
use super::*;
use crate::format::KEY_SINCE_VERSION;

/// How the log's rolls went (see [`Log::inline_segment_creations`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RollCounts {
    /// Rolls that adopted a segment prepared in the background, with no syscall.
    pub prepared: u64,
    /// Rolls that created the segment file on the caller's thread (every roll without
    /// background preparation; with it, those whose prepared segment was not ready) or waited
    /// for its preparation to finish.
    pub inline: u64,
    /// Rolls that first flushed synchronously because the previous roll's header was not
    /// durable yet (a segment filled within about two group commits).
    pub flushed: u64,
    /// Background preparations that failed or panicked ([`Log::prepare_failures`]); the roll
    /// then created the segment on the caller's thread (counted in `inline` too).
    pub prepare_failures: u64,
}

impl Log {
    /// Makes room for a record of `payload` bytes in the active segment, rolling if needed.
    pub(super) fn ensure_room(&mut self, payload: usize) -> Result<(), AppendError> {
        if self.fits(payload) {
            return Ok(());
        }
        self.roll()?;
        assert!(self.fits(payload), "record larger than segment");
        Ok(())
    }

    /// Makes room for an event of `payload` bytes and, after it, a key record of the longest
    /// key, rolling if needed (and first rolling an upgraded log's active segment older than
    /// key records). A key record written right after its publish's events
    /// ([`Log::append_key`]) then never rolls: a roll may make everything before it durable
    /// and visible (its forced sync), and the events must not be visible — their publish
    /// answered — before the key that names them is written (DESIGN.md "Key records").
    /// Only an event too large for a fresh segment with the reserve goes in without it.
    pub(super) fn ensure_room_for_event(&mut self, payload: usize) -> Result<(), AppendError> {
        if self.active.version < KEY_SINCE_VERSION {
            self.roll()?;
        }
        let with_key = payload + ENTRY_BYTES + KEY_RECORD_BYTES_MAX;
        if self.fits(with_key) {
            return Ok(());
        }
        self.roll()?;
        assert!(self.fits(payload), "record larger than segment");
        Ok(())
    }

    /// Whether a record of `payload` bytes fits in the active segment (one entry for it plus
    /// one always reserved for the seal); asks for the next segment once past half full.
    fn fits(&mut self, payload: usize) -> bool {
        let a = &self.active;
        if a.sealed || a.data_end + payload + 2 * ENTRY_BYTES > a.entry_low {
            return false;
        }
        if a.entry_low - a.data_end < a.prepare_below {
            self.request_prepare();
        }
        true
    }

    /// The active segment is past half full: have the next one prepared in the background.
    fn request_prepare(&mut self) {
        self.active.prepare_below = 0;
        let next = self.active_segment().checked_add(1);
        let Some(bg) = &mut self.bg else {
            return;
        };
        if let Some(next) = next {
            let durable = self.opts.fsync != FsyncPolicy::Never;
            let what = (next, self.opts.segment_bytes, durable);
            bg.request_prepare(&self.dir, what, false, &self.lock);
        }
    }

    /// Seals the active segment and starts the next one: the prepared one if ready (no
    /// syscall), else one created here. The sealed segment's seal reaches the disk before the
    /// new segment's header (DESIGN.md "Segment roll"): flushed here without background
    /// preparation, else by the group commits, the header waiting for them.
    pub(super) fn roll(&mut self) -> Result<(), AppendError> {
        // Found by fuzzing (`log_forged`): a last segment numbered u64::MAX (a forged name or
        // checkpoint) overflowed `number + 1` here.
        let number = self
            .active_segment()
            .checked_add(1)
            .ok_or(AppendError::SegmentNumbersExhausted)?;
        let durable = self.opts.fsync != FsyncPolicy::Never;
        if !matches!(self.active.header, HeaderState::Durable) {
            // The segment filled before its own header was durable: the next header may only
            // follow it, so make everything durable now (blocks; rare). What this makes
            // visible goes into the caller's next sync report.
            self.sync_unreported().map_err(|e| match e {
                SyncError::Io(e) => AppendError::Io(e),
                SyncError::Poisoned => AppendError::Poisoned,
            })?;
            self.rolls.flushed += 1;
        }
        if !self.active.sealed {
            let entries = self.active.entries;
            self.write_record(Kind::Seal, StreamId(u32::MAX), entries, 0, 0, |_| {});
            self.active.sealed = true;
        }
        let sealed = number - 1;
        let flushed_below = [
            self.unflushed_from,
            self.syncing.as_ref().map(|s| s.from_segment),
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(u64::MAX);
        let seal_durable = !durable || sealed < flushed_below;
        if !seal_durable && self.bg.is_none() {
            // Its records and seal on disk before anything of the next segment.
            let meta = self.segs.back().expect("active");
            if let Err(e) = meta.seg.map().flush() {
                self.poisoned = true;
                return Err(AppendError::Io(e));
            }
        }
        let file = self.next_segment_file(number, durable)?;
        let how = match (durable, self.bg.is_some(), seal_durable) {
            (false, _, _) => Stamp::Now { flush: false },
            (true, false, _) => Stamp::Now { flush: true },
            (true, true, true) => Stamp::Written,
            (true, true, false) => Stamp::Deferred,
        };
        let bytes = self.opts.segment_bytes;
        let (meta, active) = segfile::install(file, self.epoch, bytes, how, &self.lock)?;
        self.segs.push_back(meta);
        self.active = active;
        if how == Stamp::Written {
            // The header goes to disk with the next group commit.
            self.unflushed_from = Some(self.unflushed_from.unwrap_or(number));
            if durable {
                self.unsynced_since.get_or_insert_with(Instant::now);
            }
        }
        // Under `Never` the old segment may still hold unflushed records: `unflushed_from`
        // keeps pointing at it, so an explicit `sync_now` flushes it too.
        Ok(())
    }

    /// The next segment's file: the prepared one, or one created here (counted).
    fn next_segment_file(&mut self, number: u64, durable: bool) -> Result<SegFile, AppendError> {
        let spare = match &mut self.bg {
            Some(bg) => match bg.take_prepared(number) {
                background::Take::Ready(p) => {
                    self.rolls.prepared += 1;
                    return Ok(p.into_file());
                }
                background::Take::Waited(p) => {
                    self.rolls.inline += 1;
                    return Ok(p.into_file());
                }
                background::Take::Pending => return Err(AppendError::DiskFull),
                // The spare belongs to the background thread in this mode.
                background::Take::NotReady => false,
            },
            None => std::mem::take(&mut self.spare),
        };
        self.rolls.inline += 1;
        let bytes = self.opts.segment_bytes;
        let r = segfile::create_file(&self.dir, number, bytes, spare, durable, self.bg.is_some());
        if let (Err(AppendError::DiskFull), Some(bg)) = (&r, &mut self.bg) {
            // Only the background thread may adopt the spare retention leaves: ask it to.
            bg.request_prepare(&self.dir, (number, bytes, durable), true, &self.lock);
        }
        r
    }
}
