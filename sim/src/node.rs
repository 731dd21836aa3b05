//! The simulated gateway node: the real log (`log_store::Log`) with the gateway's use of it —
//! publishes (single and batch, answered once their last event is visible), the group commit
//! begun and finished as the reactor does it (the fdatasync itself is the disk's snapshot),
//! retention, the background jobs in manual mode, where a subscription starts (the real
//! resume planner over the parked windows) and what a subscription's send window is fed from
//! the log. No sockets: the clients (`clients.rs`) are on the other side.
#![forbid(unsafe_code)]

use std::io;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use log_store::{EventId, Log, LogOptions, ResumeInput, ResumeOutcome, Seq, StreamId, SyncJob};

use crate::disk::{Disk, Snapshot};
use crate::parked::Parking;
use crate::rng::Rng;
use crate::trace::Trace;
use crate::truth::{Rec, Truth};
use crate::window::SendWin;

pub type Check = Result<(), String>;

/// A publish waiting for its answer: events `first..=last` of stream `stream` (an index).
#[derive(Debug, Clone, Copy)]
pub struct Pending {
    pub stream: usize,
    pub first: Seq,
    pub last: Seq,
    /// The sequence the answer waits for (the batch's last).
    pub wait: Seq,
}

/// A group commit in flight: its job and the bytes of its files when it began.
#[derive(Debug)]
struct InFlight {
    job: SyncJob,
    snaps: Vec<Snapshot>,
}

/// How a subscription starts (the gateway's `streams::resume::start`).
#[derive(Debug)]
pub struct Started {
    pub win: SendWin,
    pub cursor: Seq,
    /// An explicit error was queued: close once it is sent.
    pub closing: bool,
    pub class: &'static str,
}

/// The node's state.
#[derive(Debug)]
pub struct Node {
    pub log: Option<Log>,
    pub opts: LogOptions,
    pub background: bool,
    pub streams: Vec<StreamId>,
    sync: Option<InFlight>,
    pub pending: Vec<Pending>,
    pub parking: Parking,
    pub poisoned: bool,
    /// Handed to `sync_due`; `group` ignores it (no wall clock in any decision).
    t0: Instant,
}

pub const HEAD_OK: &[u8] =
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\nretry: 1000\n\n";

impl Node {
    pub fn open(dir: &std::path::Path, opts: LogOptions, background: bool) -> Result<Log, String> {
        let r = if background {
            Log::open_with_manual_background(dir, opts)
        } else {
            Log::open(dir, opts)
        };
        r.map_err(|e| format!("open failed: {e}"))
    }

    pub fn new(log: Log, opts: LogOptions, background: bool, streams: Vec<StreamId>) -> Node {
        Node {
            log: Some(log),
            opts,
            background,
            streams,
            sync: None,
            pending: Vec::new(),
            parking: Parking::new(300, 2),
            poisoned: false,
            t0: Instant::now(),
        }
    }

    pub fn log(&self) -> &Log {
        self.log.as_ref().expect("log open")
    }

    fn log_mut(&mut self) -> &mut Log {
        self.log.as_mut().expect("log open")
    }

    /// Appends `events` to stream `i` (the gateway's `publish::append`): all or up to the
    /// first refused one; the answer waits for the last one's durability.
    pub fn publish(
        &mut self,
        i: usize,
        events: Vec<Rec>,
        truth: &mut Truth,
        trace: &mut Trace,
    ) -> Check {
        let sid = self.streams[i];
        let mut seqs = Vec::with_capacity(events.len());
        for rec in events {
            match self.log_mut().append(sid, rec.event.as_deref(), &rec.data) {
                Ok(a) => {
                    if a.durable {
                        return Err("an append under fsync=group was durable at once".into());
                    }
                    truth.appended(a.id.seq, rec)?;
                    seqs.push(a.id.seq);
                    trace.events += 1;
                }
                Err(e) => {
                    // An explicit error answer: nothing of this publish is acknowledged.
                    trace.note("append_refused", &[i as u64, seqs.len() as u64]);
                    if matches!(e, log_store::AppendError::Poisoned) {
                        self.fail_log(trace);
                    }
                    return Ok(());
                }
            }
        }
        let (Some(&first), Some(&last)) = (seqs.first(), seqs.last()) else {
            return Ok(());
        };
        trace.note("published", &[i as u64, first, last]);
        self.pending.push(Pending {
            stream: i,
            first,
            last,
            wait: last,
        });
        Ok(())
    }

    /// The reactor's end of turn for the log: begin a group commit when one is due, or carry
    /// the one in flight on (finished now, later — a slow fsync — or failed with EIO).
    pub fn sync_step(
        &mut self,
        rng: &mut Rng,
        eio_per_mille: u32,
        disk: &Disk,
        truths: &mut [Truth],
        trace: &mut Trace,
    ) -> Check {
        let Some(f) = self.sync.take() else {
            let t0 = self.t0;
            if self.log().sync_due(t0)
                && let Some(job) = self.log_mut().begin_sync()
            {
                let snaps = disk.snapshot(job.fds());
                trace.note("sync_begin", &[snaps.len() as u64]);
                self.sync = Some(InFlight { job, snaps });
            }
            return Ok(());
        };
        if rng.chance(250) {
            trace.fault("sync_slow", &[]);
            self.sync = Some(f);
            return Ok(());
        }
        let outcome = if rng.chance(eio_per_mille) {
            trace.fault("sync_eio", &[]);
            Err(io::Error::from_raw_os_error(5))
        } else {
            disk.commit(f.snaps);
            Ok(())
        };
        match self.log_mut().finish_sync(f.job, outcome) {
            Ok(report) => {
                for (sid, seq) in &report.advanced {
                    trace.note("visible", &[u64::from(sid.0), *seq]);
                }
                self.answer(disk, truths, trace)
            }
            Err(_) => {
                self.fail_log(trace);
                Ok(())
            }
        }
    }

    /// The log is poisoned: waiting publishes get `500 log_failed` (not acknowledged).
    pub fn fail_log(&mut self, trace: &mut Trace) {
        self.poisoned = true;
        trace.note("poisoned", &[self.pending.len() as u64]);
        self.pending.clear();
    }

    /// Answers the publishes whose awaited event is visible; each answered event must be
    /// durable (its bytes in the disk's durable image).
    pub fn answer(&mut self, disk: &Disk, truths: &mut [Truth], trace: &mut Trace) -> Check {
        let mut keep = Vec::with_capacity(self.pending.len());
        for p in std::mem::take(&mut self.pending) {
            let sid = self.streams[p.stream];
            let visible = self.log().bounds(sid).map_or(0, |b| b.visible_tail);
            if visible < p.wait {
                keep.push(p);
                continue;
            }
            for seq in p.first..=p.last {
                if !self.is_durable(disk, sid, seq) {
                    return Err(format!(
                        "publish of {sid} {}..={} answered while event {seq} is not durable",
                        p.first, p.last
                    ));
                }
            }
            let t = &mut truths[p.stream];
            t.acked = t.acked.max(p.last);
            trace.note("answered", &[p.stream as u64, p.last]);
        }
        self.pending = keep;
        Ok(())
    }

    /// Whether event `seq` of `sid` is in the disk's durable image (or retention deleted it
    /// already, which it does only to durable records: nothing left to check).
    pub fn is_durable(&self, disk: &Disk, sid: StreamId, seq: Seq) -> bool {
        match self.log().record(sid, seq) {
            Ok(s) => disk.is_durable(s.segment_number(), s.file_offset(), s.as_bytes()),
            Err(log_store::ReadError::Truncated { .. }) => true,
            Err(_) => false,
        }
    }

    /// Retention by bytes (the clock it is handed is fixed: age never decides).
    pub fn retention(&mut self, trace: &mut Trace) {
        let now = UNIX_EPOCH + Duration::from_secs(4_000_000_000);
        let now: SystemTime = now;
        match self.log_mut().enforce_retention(now) {
            Ok(r) => trace.note("retention", &[r.segments_deleted as u64]),
            Err(_) => trace.note("retention_failed", &[]),
        }
    }

    pub fn background_jobs(&mut self, trace: &mut Trace) {
        if self.background {
            let n = self.log_mut().run_background_jobs();
            trace.note("background", &[n as u64]);
        }
    }

    /// Forgets everything a process crash loses; returns the log to be dropped as crashed.
    pub fn crash(&mut self) -> Log {
        self.sync = None;
        self.pending.clear();
        self.parking.clear();
        self.poisoned = false;
        self.log.take().expect("log open")
    }

    /// Where a subscription to stream `i` starts (the gateway's `streams::resume::start`):
    /// without an ID at the floor; with one, as the resume planner decides.
    pub fn subscribe(&mut self, i: usize, last_event_id: Option<&str>, step: u64) -> Started {
        let sid = self.streams[i];
        let log = self.log.as_ref().expect("log open");
        let bounds = log.bounds(sid).expect("stream exists");
        let mut win = SendWin::default();
        let Some(raw) = last_event_id else {
            win.push_bytes(HEAD_OK);
            return started(win, bounds.floor, false, "fresh");
        };
        let requested: EventId = match raw.parse() {
            Ok(id) => id,
            Err(_) => return refused(win, 400, "bad_last_event_id"),
        };
        let epoch = log.epoch();
        let window = self.parking.view(sid, epoch, requested.seq, step);
        let plan = log_store::plan_resume(&ResumeInput {
            log_epoch: epoch,
            stream: sid,
            bounds,
            requested,
            window,
            known_epochs: &[],
        });
        match plan.outcome() {
            ResumeOutcome::Serve {
                class,
                from,
                aligned,
            } => {
                win.push_bytes(HEAD_OK);
                if let Some((head, last)) = aligned {
                    win.push_parked(self.parking.take(sid, head, last));
                }
                started(win, from, false, class.label())
            }
            ResumeOutcome::Gone { .. } => refused(win, 410, "truncated"),
            ResumeOutcome::Refused(r) => refused(win, 400, r.code),
        }
    }
}

fn started(win: SendWin, cursor: Seq, closing: bool, class: &'static str) -> Started {
    Started {
        win,
        cursor,
        closing,
        class,
    }
}

fn refused(mut win: SendWin, status: u16, code: &'static str) -> Started {
    let head = format!("HTTP/1.1 {status} Refused\r\ncontent-type: application/json\r\n\r\n");
    win.push_bytes(head.as_bytes());
    win.push_bytes(format!("{{\"error\":\"{code}\"}}").as_bytes());
    started(win, 0, true, code)
}
