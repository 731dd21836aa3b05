//! The whole node's checks, beyond those its clients make on what they read: the durable
//! image behind every answer and every event shown, what a crash recovered, 410s against the
//! log's floor, windows against what their clients read, wake-ups in the calm steps, and the
//! end (every publish answered, no subscriber stalled).

use log_store::{Log, StreamId};

use super::client::Check;
use super::{QUIET_STEPS, WAKE_STEPS_MAX, World};
use crate::sse;

impl World {
    /// Subscriber `i`'s resume was answered 410: its next event must be below the floor now
    /// (floors only rise, so one that was servable when answered may pass unseen, never the
    /// reverse). It starts again from the floor.
    pub(super) fn check_gone(&mut self, i: usize) -> Check {
        let s = &self.subs[i];
        let want = s.last.as_ref().map_or(1, |l| l.1 + 1);
        let floor = self.bounds(s.stream)?.map_or(1, |b| b.floor);
        if floor <= want {
            return Err(format!(
                "{}: a resume for event {want} answered 410 while the floor is {floor}",
                self.truths[s.stream].name
            ));
        }
        self.note("gone", &[i as u64, want, floor]);
        self.subs[i].last = None;
        Ok(())
    }

    /// The running node's log holding stream `stream`, its shard, and the stream's id there
    /// (`None`: not created yet).
    pub(super) fn stream_log(
        &self,
        stream: usize,
    ) -> Result<(&Log, u32, Option<StreamId>), String> {
        let name = &self.truths[stream].name;
        let shard = gateway::shards::shard_of(name, self.cfg.cores as u32);
        let log = (self.cores.get(shard as usize))
            .and_then(|c| c.log(shard))
            .ok_or_else(|| format!("no core holds shard {shard}"))?;
        let sid = (log.streams())
            .find(|(_, n, _)| *n == name.as_str())
            .map(|(id, _, _)| id);
        Ok((log, shard, sid))
    }

    /// The bounds of stream `stream` in the running node's log (`None`: not created yet).
    pub(super) fn bounds(&self, stream: usize) -> Result<Option<log_store::Bounds>, String> {
        let (log, _, sid) = self.stream_log(stream)?;
        Ok(sid.and_then(|id| log.bounds(id)))
    }

    /// Event `seq` of stream `stream`, `what` (answered, shown), is in the disk's durable
    /// image: what the node claims or shows must survive any crash from now on.
    pub(super) fn durable(&self, stream: usize, seq: u64, what: &str) -> Check {
        let name = &self.truths[stream].name;
        let (log, shard, sid) = self.stream_log(stream)?;
        let sid = sid.ok_or_else(|| format!("{name}: event {seq} {what}, and no such stream"))?;
        self.durable_at(
            (log, shard),
            sid,
            seq,
            &format!("{name}: event {seq} {what}"),
        )
    }

    /// The event of ID `id`, of an MCP stream of session `session`, `what` (shown), is in the
    /// disk's durable image, in the log of the shard the session's ID names (the core that
    /// minted it keeps its streams there).
    pub(super) fn durable_mcp(&self, session: Option<&str>, id: &str, what: &str) -> Check {
        let ev: log_store::EventId = id.parse().map_err(|e| format!("MCP event ID {id}: {e}"))?;
        let session = session.ok_or_else(|| format!("MCP event {id} {what} before a session"))?;
        let shard = gateway::shards::mcp_owner_shard(session, self.cfg.cores as u32);
        let log = (self.cores.get(shard as usize))
            .and_then(|c| c.log(shard))
            .ok_or_else(|| format!("no core holds shard {shard}"))?;
        if ev.epoch != log.epoch() {
            return Err(format!(
                "MCP event {id} {what}: not of its session's shard {shard}"
            ));
        }
        self.durable_at(
            (log, shard),
            ev.stream,
            ev.seq,
            &format!("MCP event {id} {what}"),
        )
    }

    /// Record `seq` of stream `sid` in `log` (of shard `shard`) is durable; `label` names it.
    fn durable_at(&self, (log, shard): (&Log, u32), sid: StreamId, seq: u64, label: &str) -> Check {
        if log.bounds(sid).is_some_and(|b| seq < b.floor) {
            return Ok(()); // deleted by retention, which deletes only durable records
        }
        let r = log.record(sid, seq).map_err(|e| format!("{label}: {e}"))?;
        let dir = gateway::shards::shard_dir(self.disk.dir(), shard);
        if !(self.disk).is_durable_in(&dir, r.segment_number(), r.file_offset(), r.as_bytes()) {
            return Err(format!("{label} while not durable"));
        }
        Ok(())
    }

    /// The log of the shard holding `name`.
    pub(super) fn log_of<'a>(&self, logs: &'a [Log], name: &str) -> &'a Log {
        &logs[gateway::shards::shard_of(name, self.cfg.cores as u32) as usize]
    }

    /// Every event acknowledged or shown is in the recovered log, unchanged.
    pub(super) fn check_recovered(&self, logs: &[Log]) -> Check {
        for t in &self.truths {
            let log = self.log_of(logs, &t.name);
            let Some(&(_, first)) = t.by_seq.iter().next().map(|(s, d)| (d, s)).as_ref() else {
                continue;
            };
            let id = log
                .streams()
                .find(|(_, name, _)| *name == t.name)
                .map(|(id, _, _)| id)
                .ok_or_else(|| format!("{}: lost in a crash (event {first} was known)", t.name))?;
            let b = log.bounds(id).ok_or("bounds")?;
            if b.tail < t.known_max() {
                return Err(format!(
                    "{}: the crash lost events: tail {} after {} were acknowledged or shown",
                    t.name,
                    b.tail,
                    t.known_max()
                ));
            }
            for (&seq, data) in t.by_seq.range(b.floor..) {
                let r = log
                    .record(id, seq)
                    .map_err(|e| format!("{}: record {seq}: {e}", t.name))?;
                let block = r.as_bytes();
                let block = block.strip_suffix(b"\n\n").unwrap_or(block);
                match sse::parse_block(block)? {
                    sse::Item::Event { data: d, .. } if d == *data => {}
                    other => {
                        return Err(format!(
                            "{}: recovered event {seq} is {other:?}, was {:?}",
                            t.name,
                            String::from_utf8_lossy(data)
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// Events `ids` of `stream` were acknowledged: each subscriber that had everything before
    /// them must get them within [`WAKE_STEPS_MAX`] steps.
    pub(super) fn expect_wakeups(&mut self, stream: usize, ids: &[(u64, Vec<u8>)]) {
        let (Some(first), Some(last)) =
            (ids.iter().map(|x| x.0).min(), ids.iter().map(|x| x.0).max())
        else {
            return;
        };
        self.due.resize(self.subs.len(), None);
        for (i, s) in self.subs.iter().enumerate() {
            let seen = s.last.as_ref().map_or(0, |l| l.1);
            let live = s.conn.is_some() && s.status == Some(200) && s.stream == stream;
            if live && seen + 1 >= first && seen < last && self.due[i].is_none() {
                self.due[i] = Some((last, self.step + WAKE_STEPS_MAX));
                self.kernel
                    .borrow_mut()
                    .trace
                    .note("wake due", &[i as u64, last]);
            }
        }
    }

    /// Every subscriber due an event has it by its step.
    pub(super) fn woken(&mut self) -> Check {
        for (i, due) in self.due.iter_mut().enumerate() {
            let Some((seq, by)) = *due else { continue };
            let s = &self.subs[i];
            if s.last.as_ref().is_some_and(|l| l.1 >= seq) || s.conn.is_none() {
                *due = None;
            } else if self.step > by {
                return Err(format!(
                    "subscriber {i} was caught up, and event {seq} acknowledged {WAKE_STEPS_MAX} \
                     steps ago has not reached it (a lost wake-up?)"
                ));
            }
        }
        Ok(())
    }

    /// Every publish sent has its answer, and every subscriber connected and answered 200 has
    /// observed its stream up to the last event acknowledged, or is still catching up.
    pub(super) fn caught_up(&self) -> Check {
        for (i, p) in self.pubs.iter().enumerate() {
            if p.busy() {
                return Err(format!(
                    "publisher {i}'s request has no answer after {QUIET_STEPS} quiet steps"
                ));
            }
        }
        for (i, s) in self.subs.iter().enumerate() {
            let t = &self.truths[s.stream];
            let seen = s.last.as_ref().map_or(0, |l| l.1);
            // Behind is allowed while it catches up (a slow reader's backlog of large events
            // through a small window takes a while); stalled is not.
            let idle = self.step - self.progress.get(i).copied().unwrap_or(0);
            if s.conn.is_some() && s.status == Some(200) && seen < t.acked_max && idle > 100 {
                return Err(format!(
                    "subscriber {i} of {} stalled at {seen} for {idle} quiet steps, {} \
                     acknowledged",
                    t.name, t.acked_max
                ));
            }
        }
        Ok(())
    }

    /// No plaintext subscriber's window has released more than its client read (the
    /// window's bytes are all its connection sent: a subscription is a fresh connection's
    /// only request), while the client has its end open (once it closed, the kernel drops what
    /// it did not read and `SIOCOUTQ` says 0, so the window releases it: harmless, since a
    /// parked window serves a resume only when its head is the client's next event).
    /// Checked after the cores' turns, when every executed send's completion has been taken.
    pub(super) fn windows_confirmed(&self) -> Check {
        let k = self.kernel.borrow();
        for core in &self.cores {
            for (fd, acked) in core.confirmed() {
                let read = (k.peer_of(fd))
                    .and_then(|serial| self.reads.get(&serial))
                    .map(|r| r.get());
                if let Some((read, false)) = read
                    && acked > read
                {
                    return Err(format!(
                        "a window released {acked} bytes; its client had read {read}"
                    ));
                }
            }
        }
        Ok(())
    }
}
