//! Retention: which sealed segments go, the checkpoint that must be durable before they do, the
//! floors that move, and what becomes of each retired file (unlinked, or kept as the spare).
//! Inline, or — in background mode — the checkpoint and the deletions on the background thread
//! while the floors move at once.
#![forbid(unsafe_code)]

use super::*;

/// A segment retention took out of the log, deleted once the checkpoint is durable.
#[derive(Debug)]
pub(crate) struct Retiring {
    pub(crate) seg: Arc<Segment>,
    pub(crate) bytes: u64,
}

impl Log {
    /// Deletes whole sealed segments, oldest first, while the log exceeds `retain_bytes` or the
    /// oldest sealed segment's newest record is older than `retain_secs`; advances floors.
    /// Writes the checkpoint before deleting anything.
    ///
    /// Inline (no background thread): makes every append durable first (as `sync_now`; the
    /// streams this makes visible are reported by the next `finish_sync`, `sync_now` or
    /// `poll_sync`), writes the checkpoint, then deletes. In background mode it never blocks: it retires only
    /// segments whose records are all durable and visible already (a segment still covered by
    /// a pending group commit waits for a later pass), moves the floors at once, and queues
    /// "write the checkpoint, then delete these segments" for the background thread; the
    /// report counts them as deleted. A failed background checkpoint deletes nothing: the next
    /// pass reports its error and queues it again.
    pub fn enforce_retention(
        &mut self,
        now: SystemTime,
    ) -> Result<RetentionReport, RetentionError> {
        if self.bg.is_some() {
            return self.retain_in_background(now);
        }
        let k = self.retention_cut(now, self.segs.len());
        if k == 0 {
            return Ok(RetentionReport::default());
        }
        // Tails in the checkpoint must be durable, or a crash could leave a checkpointed tail
        // above what the disk holds. What this makes visible goes into the caller's next sync
        // report.
        if self.opts.fsync != FsyncPolicy::Never {
            self.sync_unreported().map_err(RetentionError::Sync)?;
        }
        let moves = self.floor_moves(k);
        write_checkpoint(&self.dir, &self.checkpoint(k, &moves))?;
        let (report, retired) = self.retire_prefix(k, &moves);
        for r in retired {
            retire_segment(
                &self.dir,
                r.seg,
                r.bytes,
                self.opts.segment_bytes,
                &mut self.spare,
            );
        }
        Ok(report)
    }

    fn retain_in_background(&mut self, now: SystemTime) -> Result<RetentionReport, RetentionError> {
        if self.poisoned {
            return Err(RetentionError::Sync(SyncError::Poisoned));
        }
        let bg = self.bg.as_mut().expect("background mode");
        if let Some((e, left)) = bg.take_failed() {
            // Retry with the floors as they are now; nothing new is retired in this pass.
            let ckpt = self.checkpoint(0, &[]);
            let bytes = self.opts.segment_bytes;
            let bg = self.bg.as_mut().expect("background mode");
            bg.submit_checkpoint(&self.dir, ckpt, left, bytes, &self.lock);
            return Err(e);
        }
        let limit = self.settled_prefix();
        let k = self.retention_cut(now, limit);
        if k == 0 {
            return Ok(RetentionReport::default());
        }
        let moves = self.floor_moves(k);
        let ckpt = self.checkpoint(k, &moves);
        let (report, retired) = self.retire_prefix(k, &moves);
        let bytes = self.opts.segment_bytes;
        let bg = self.bg.as_mut().expect("background mode");
        bg.submit_checkpoint(&self.dir, ckpt, retired, bytes, &self.lock);
        Ok(report)
    }

    /// How many leading segments retention should delete (never the active one, nor more
    /// than `limit`).
    fn retention_cut(&self, now: SystemTime, limit: usize) -> usize {
        let now_ms = now_unix_ms(now);
        let mut total: u64 = self.segs.iter().map(|m| m.bytes).sum();
        let mut k = 0;
        while k + 1 < self.segs.len() && k < limit {
            let m = &self.segs[k];
            let by_bytes = self.opts.retain_bytes.is_some_and(|r| total > r);
            let by_age = self
                .opts
                .retain_secs
                .is_some_and(|s| m.newest_ts_ms.saturating_add(s.saturating_mul(1000)) < now_ms);
            if !(by_bytes || by_age) {
                break;
            }
            total -= m.bytes;
            k += 1;
        }
        k
    }

    /// How many leading segments hold only durable, visible records, so their records may drop
    /// below the floors without a sync: those below the oldest segment a pending or running
    /// group commit covers, and — while the active segment's header is not durable (its sync
    /// outcomes are held, and may cover the segment before it) — below that segment. The first
    /// live segment of a checkpoint is thereby always one whose header is durable.
    fn settled_prefix(&self) -> usize {
        let active = self.active_segment();
        let mut below = active;
        if self.opts.fsync != FsyncPolicy::Never {
            let pending = [
                self.unflushed_from,
                self.syncing.as_ref().map(|s| s.from_segment),
            ];
            below = pending.into_iter().flatten().fold(below, u64::min);
            if !matches!(self.active.header, HeaderState::Durable) {
                below = below.min(active.saturating_sub(1));
            }
        }
        self.segs
            .iter()
            .take_while(|m| m.seg.number < below)
            .count()
    }

    /// Per live stream with records in the first `k` segments: how many (its floor's move).
    fn floor_moves(&self, k: usize) -> Vec<(StreamId, u64)> {
        let first_number = self.segs[0].seg.number;
        let doomed = |loc: &Loc| (loc.seg.wrapping_sub(first_number as u32) as u64) < k as u64;
        let mut moves: Vec<(StreamId, u64)> = Vec::new();
        let mut seen = vec![false; self.streams.ids()];
        for m in self.segs.range(..k) {
            for &id in &m.streams {
                if std::mem::replace(&mut seen[id.0 as usize], true) {
                    continue;
                }
                let Some(st) = self.streams.get(id) else {
                    continue; // removed: nothing of it is indexed
                };
                let n = st.index.iter().take_while(|l| doomed(l)).count() as u64;
                if n > 0 {
                    moves.push((id, n));
                }
            }
        }
        moves
    }

    /// The checkpoint allowing the first `k` segments' deletion, with `moves` applied: every
    /// stream id, live ones with their floor and their *visible* tail (durable: a checkpointed
    /// tail must never exceed what the disk holds), removed ones as tombstones, so they stay
    /// removed (and their ids used) after the segments holding their name and removal records
    /// are gone.
    fn checkpoint(&self, k: usize, moves: &[(StreamId, u64)]) -> Checkpoint {
        let mut ckpt = Checkpoint {
            epoch: self.epoch,
            first_live_segment: self.segs[k].seg.number,
            streams: self
                .streams
                .iter_ids()
                .map(|s| {
                    s.map(|s| CheckpointStream {
                        name: s.name.to_string(),
                        floor: s.floor,
                        tail: s.visible,
                    })
                })
                .collect(),
        };
        for &(id, n) in moves {
            ckpt.streams[id.0 as usize]
                .as_mut()
                .expect("a live stream")
                .floor += n;
        }
        ckpt
    }

    /// Moves the floors and takes the first `k` segments out of the log.
    fn retire_prefix(
        &mut self,
        k: usize,
        moves: &[(StreamId, u64)],
    ) -> (RetentionReport, Vec<Retiring>) {
        let mut report = RetentionReport::default();
        for &(id, n) in moves {
            let st = &mut self.streams[id];
            st.index.drain(..n as usize);
            st.floor += n;
            assert!(st.floor <= st.visible + 1, "floor passed the visible tail");
            report.floors_advanced.push((id, st.floor));
        }
        let retired = self
            .segs
            .drain(..k)
            .map(|m| {
                report.segments_deleted += 1;
                report.bytes_deleted += m.bytes;
                Retiring {
                    seg: m.seg,
                    bytes: m.bytes,
                }
            })
            .collect();
        (report, retired)
    }
}

/// Writes `ckpt` durably: tmp file, `fsync`, `rename`, `fsync(dir)`.
pub(crate) fn write_checkpoint(dir: &Path, ckpt: &Checkpoint) -> Result<(), RetentionError> {
    let tmp = dir.join(CHECKPOINT_TMP_FILE);
    let dst = dir.join(CHECKPOINT_FILE);
    let err = |path: &Path| {
        let path = path.to_owned();
        move |source| RetentionError::Io { path, source }
    };
    {
        let mut f = File::create(&tmp).map_err(err(&tmp))?;
        io::Write::write_all(&mut f, &ckpt.encode()).map_err(err(&tmp))?;
        f.sync_all().map_err(err(&tmp))?;
    }
    fs::rename(&tmp, &dst).map_err(err(&dst))?;
    sync_dir(dir).map_err(err(dir))?;
    Ok(())
}

/// A segment a durable checkpoint no longer counts: kept as the spare for the next roll when
/// nothing pins it (`seg` is its only reference, and none can be made any more: new slices
/// come from the log, which dropped it) and there is none yet, else unlinked when its last
/// reference drops.
pub(crate) fn retire_segment(
    dir: &Path,
    seg: Arc<Segment>,
    bytes: u64,
    segment_bytes: u64,
    spare: &mut bool,
) {
    let reusable = !*spare
        && Arc::strong_count(&seg) == 1
        && bytes == segment_bytes
        && fs::rename(&seg.path, dir.join(SPARE_FILE)).is_ok();
    if reusable {
        *spare = true;
    } else {
        seg.unlink_on_drop.store(true, Ordering::Release);
    }
}
